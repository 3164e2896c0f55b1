"""Decision lines are written by a thread of their own, and none is lost when a worker exits."""

import io
import logging
import threading

from webhook.serve.decision_log import (
    BackgroundLines,
    flush_decision_lines,
    line_writer,
    log_lines_in_background,
)


def _logger(name: str, stream) -> logging.Logger:
    logger = logging.getLogger(f"test.decision_log.{name}")
    logger.handlers.clear()
    log_lines_in_background(logger, stream)
    return logger


def test_every_line_is_written_in_order_once_flushed():
    stream = io.StringIO()
    logger = _logger("order", stream)
    for n in range(5000):
        logger.info('{"n": %d}', n)
    flush_decision_lines(logger)
    assert stream.getvalue().splitlines() == [f'{{"n": {n}}}' for n in range(5000)]


def test_lines_from_many_request_threads_are_all_written_whole():
    stream = io.StringIO()
    logger = _logger("threads", stream)

    def requests(worker: int) -> None:
        for n in range(500):
            logger.info("worker=%d n=%d", worker, n)

    threads = [threading.Thread(target=requests, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    flush_decision_lines(logger)
    lines = stream.getvalue().splitlines()
    assert sorted(lines) == sorted(f"worker={w} n={n}" for w in range(8) for n in range(500))


def test_the_request_thread_does_not_write_to_the_stream():
    writers: list[str] = []
    written = threading.Event()

    class Recording(io.StringIO):
        def write(self, text):
            writers.append(threading.current_thread().name)
            written.set()
            return super().write(text)

    logger = _logger("thread", Recording())
    logger.info("one decision")
    assert written.wait(timeout=10)
    flush_decision_lines(logger)
    assert writers[0] == "decision-log"


def test_a_closed_log_stream_does_not_fail_the_decision():
    stream = io.StringIO()
    logger = _logger("closed", stream)
    stream.close()
    logger.info("still decided")
    flush_decision_lines(logger)  # no exception


def test_logging_after_a_flush_starts_a_new_writer():
    stream = io.StringIO()
    logger = _logger("restart", stream)
    logger.info("before")
    flush_decision_lines(logger)
    logger.info("after")
    flush_decision_lines(logger)
    assert stream.getvalue().splitlines() == ["before", "after"]


def test_installing_twice_keeps_one_handler():
    logger = _logger("twice", io.StringIO())
    log_lines_in_background(logger, io.StringIO())
    assert sum(isinstance(h, BackgroundLines) for h in logger.handlers) == 1


def test_a_worker_exit_writes_the_lines_its_writer_has_not_written_yet(monkeypatch):
    """The writer lingers before writing: what is queued when gunicorn's worker_exit hook runs
    is written by the hook, not lost with the process."""
    from webhook.serve import app, decision_log, gunicorn

    monkeypatch.setattr(decision_log, "LINGER", 30.0)
    stream = io.StringIO()
    logger = logging.getLogger(app.DECISION_LOG)
    saved = logger.handlers[:]
    logger.handlers.clear()
    try:
        log_lines_in_background(logger, stream)
        for n in range(50):
            logger.info('{"n": %d}', n)
        assert stream.getvalue() == ""  # still lingering
        gunicorn._worker_exit(object())
        assert len(stream.getvalue().splitlines()) == 50
    finally:
        logger.handlers[:] = saved


def test_lines_logged_while_flushing_are_all_written_and_no_flush_waits_out_its_timeout():
    import time

    stream = io.StringIO()
    logger = _logger("racing-flush", stream)
    done = threading.Event()

    def requests() -> None:
        for n in range(20_000):
            logger.info('{"n": %d}', n)
        done.set()

    thread = threading.Thread(target=requests)
    started = time.monotonic()
    thread.start()
    while not done.is_set():
        flush_decision_lines(logger)
    thread.join()
    flush_decision_lines(logger)
    assert time.monotonic() - started < 5
    assert sorted(int(line[6:-1]) for line in stream.getvalue().splitlines()) == list(range(20_000))


def test_a_line_goes_straight_to_the_writers_queue_only_when_it_is_the_loggers_one_handler():
    stream = io.StringIO()
    logger = _logger("straight", stream)
    write = line_writer(logger)
    assert write == logger.handlers[0].line  # no LogRecord built
    write('{"n": 1}')
    flush_decision_lines(logger)
    assert stream.getvalue() == '{"n": 1}\n'
    logger.addHandler(logging.NullHandler())  # someone else listens too: through logging
    assert line_writer(logger) == logger.info
