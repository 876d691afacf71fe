"""Calibration from measurements: `python -m pytest_inferbench.sim calibrate` fits the physics'
named efficiency knobs (`physics.Efficiency`) per (hardware, framework, model) to measured
points and writes a calibration file; `--inferbench-sim-calibration FILE` makes the simulator
use it. `knobs` (the knobs, their bounds and units), `points` (measured points from result
files and CSV), `fit` (the bounded fit and its leave-one-out report), `file` (the calibration
file: written atomically, read with clear errors, applied to an engine config), `cli` (the
command). See docs/simulator.md, "Calibration from measurements".
"""
