"""Capacity held for allowed binds until the watch shows the pod bound.

Between an allowed bind and the watch event that shows the pod on its node, another bind must
not be handed the same capacity: not by another thread, another gunicorn worker, or another
replica of the guard. Two stores, both "read, re-check, write":

- ``LocalTable``: one memory-mapped file per node in a directory the workers of one replica
  share (the pod's ``/tmp``), under ``flock``. Enough for pods whose resources only this
  replica's binds race for in practice (cpu, memory), and no API writes.
- ``LeaseStore``: one ``coordination.k8s.io/v1`` Lease per node in the guard's namespace,
  holding that node's reservations in an annotation, replaced with its ``resourceVersion``:
  a 409 means another writer won, so read again and re-check. The API server (etcd) is the
  only arbiter; the guard builds no consensus of its own.

A coordinated bind goes through both: the replica's table is locked for the node while the
Lease is read and written, and the decision counts the entries of both. The table mirrors what
the replica last read of the Lease, so a bind that waited for a sibling's decision on the same
node is decided with what that sibling wrote, and a denial needs no round trip. A reservation
stops counting when the state shows the pod bound (its own record then counts, never both),
deleted or terminal, after its TTL, or, for one made by an unauthenticated caller, when the
state has not shown the pod on its node within its confirmation time; it is dropped from the
store only then, since another worker's or replica's watch may lag.

Waiting is bounded twice (``Budget``): for siblings (the table's lock, Lease conflicts) by
``waitSeconds`` — past it the bind is denied ``Busy``, so the scheduler retries — and for
the API server by ``deadlineSeconds`` a call — a slower answer is an outage (``DeadlineExceeded``).
"""
