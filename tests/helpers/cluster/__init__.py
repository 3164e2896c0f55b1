"""The cluster in a box (issue 28): the two incidents, end to end, with and without the guard.

An API-server double admits writes through the webhooks of the configuration rendered from
``deploy/`` and calls the real guard (``admit-guard serve``, two replicas of two workers) over
HTTPS; controllers, two schedulers with stale caches, kubelets with the device manager's
accounting and a DRA driver act on it. Those are written from upstream Kubernetes behaviour
and import nothing from ``webhook`` but the certificate issuer a deployment runs
(``test_cluster_box.py`` scans the imports), so a mistake in the guard's checks cannot hide
itself by being shared with the cluster that judges it.
"""
