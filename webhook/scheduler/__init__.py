"""kube-scheduler's view: its default filters (``filters.py``) and where a pod could go, the
scheduler's filters and the kubelet's admission together (``placement.py``, for ``explain`` and
the nodes denial messages name)."""
