"""The ``splitfuse`` command: the one place that joins the engine, calibration and the simulator (which do not
import each other's front ends)."""
