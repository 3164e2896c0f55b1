"""The DRA allocator's judge (``judge.py``): when a device is in use, per
docs/dra-allocation-spec.md, over the state's device index and the allocations in flight."""
