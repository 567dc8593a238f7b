"""The core: named score scales, attention with hook points, and the measurements.

Imports nothing above it; torch is its only dependency."""
