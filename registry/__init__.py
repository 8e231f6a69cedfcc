"""The artefact registry: manifests, storage backends, resolution against the local GPU, verified pulls."""
