"""The artefact registry: manifests, storage backends, resolver, verified pulls (design.md §5).

- ``names``: model ids, keys, channels, references, and where each lives in the layout
- ``manifest``: the manifest model (schema 1) and the path-safety rules
- ``store``: the small backend interface; ``local``, ``s3`` and ``bundle`` implement it
- ``publish``: blobs, then the manifest (the commit point), then the channels
- ``catalog``, ``refs``: reading manifests, moving channels with compare-and-swap
- ``resolve`` (pure) and ``machine`` (its adapter): which artefact runs here; ``choose``: which one to take
- ``pull``, ``cache``, ``transfer``: resumable, verified downloads into a shared blob cache
- ``gc``: retention and unreferenced blobs
"""
