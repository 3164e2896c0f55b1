"""The leaves: file and wire formats read strictly (YAML and JSON manifests, snapshots item by
item, kustomize, chunked HTTP bodies, JSON nested past a parser's limit) and JUnit written.
They import no project module but each other."""
