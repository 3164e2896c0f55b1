"""Serving: the path of an AdmissionReview from the kube-apiserver's socket to the reply.

::

    kube-apiserver ── HTTPS POST /validate ──┐
      listener     gunicorn.py  a listening socket per worker (SO_REUSEPORT): the kernel spreads
                   listening.py new connections over the workers; the master holds the address
                                without listening; a worker listens once its state is ready (or
                                when no sibling listens)
      socket       worker.py    GuardWorker.accept: TCP_NODELAY; the connection waits in the
                                poller, not even wrapped in TLS, until its first byte (first-byte
                                timeout, connection limit: the oldest idle connection makes room)
      event loop   worker.py    GuardWorker._advance: TLS handshake and reads on non-blocking
                                sockets, one deadline per request (408), the buffer budget (503)
      framing      framing.py   RequestFraming: where the request ends (head, Content-Length,
                                chunks through ../chunked.py); 413 and 400 from the loop
      loop/thread  worker.py    GuardWorker._submit: an admission review the loop decides itself
                                (on_loop; one that would wait raises ../state/waiting.py's
                                WouldWait and goes on), else the whole request to gunicorn's
                                thread pool, which never reads a client: a plain head the loop
                   direct.py    parsed is answered from that parse (Exchange: environ, reply);
                                any other is parsed again from the buffered bytes by gunicorn
      WSGI         reply.py     with_client_identity: whether the client certificate verified
                   wsgi.py      AdmissionEndpoints: POST /validate and /mutate (403, 405, 413);
                                every other path to the Flask app (app.py: /healthz /readyz
                                /metrics)
      admission    app.py       create_app's answer: ../admission.py parses the review; the bind
                                and allocation guards; metrics.py counts, decision_log.py logs
      engine       ../engine.py evaluate: every policy of the registry
      reply        reply.py     Reply: the answer in one send; what a slow reader leaves is sent
                                by the loop (GuardWorker.finish_request), then the connection
                                goes back to the loop (keep-alive) or lingers and closes
    ◀── AdmissionReview response ─────────────┘

Around the path: ``gunicorn.py`` (``GuardServer``, ``ServeOptions``: gunicorn built in code),
``tls.py`` (the context, rebuilt when the certificate files change; their expiry gauge),
``prefork.py`` (what the master prepares before the fork and each worker builds after),
``periodic_audit.py`` (``serve --audit-interval``), ``metric_files.py`` (the metrics'
multi-process files), and ``limits.py``: every limit a client meets on the way, in one place.

One chunked decoder: ``webhook/formats/chunked.py`` frames chunked requests in the loop and decodes the
informer's watch streams (``state/apiserver.py``), with one grammar and one set of caps; the
server adds only its body limits. It lives below both packages because the informer is below
this one. A chunked request is parsed again by gunicorn from the same bytes (``wsgi.input``):
handing its parser a body decoded here would mean rewriting the request's head, which is where
request smuggling lives. Whatever it reads has already passed the stricter framing of the loop.

Importing this package is cheap (the CLI reads ``limits``): ``create_app``, ``GuardServer`` and
``ServeOptions`` are imported on first use.
"""

from __future__ import annotations

from .. import lazy_names

TYPE_CHECKING = False  # ``typing`` alone would double the cost of importing the CLI

if TYPE_CHECKING:
    from .app import create_app
    from .gunicorn import GuardServer, ServeOptions

__all__ = ["GuardServer", "ServeOptions", "create_app"]
__getattr__, __dir__ = lazy_names(
    __name__, {"create_app": "app", "GuardServer": "gunicorn", "ServeOptions": "gunicorn"}
)
