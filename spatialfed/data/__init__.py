"""Spatial data layer: simulation, ingest, partitions, the Zarr store, geometry and shipped datasets."""
