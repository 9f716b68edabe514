"""Calibration: profile a GPU into cost curves, fit a cost model, ship the profiles.

- ``profile.py``: the versioned profile file and ``load_profile`` (torch-free; what the simulator imports).
- ``cost_model.py``: the piecewise-linear-plus-attention cost model and its least-squares fit.
- ``fitting.py``: measured points -> profile (held-out split, errors, spread of pass times, energy model).
- ``energy.py``: a pass's joules (idle power x time + linear work terms), the profile's ``energy`` section, its fit.
- ``power.py``: NVML's energy counter and power (the sweep's joules per pass; the GPU benchmarks').
- ``plans.py``: which passes a sweep measures, built into real ``BatchPlan``s by the real scheduler.
- ``analytic.py``: a NON-measured roofline profile with stated assumptions (a stand-in until a GPU sweep).
- ``plots.py``: a profile's figures (offline HTML, PNG through kaleido).
- ``validation_results.py``: the sim-against-engine results format (``validation/*.csv``), read and compared.
- ``profiles/``: the shipped profiles, ``<model>-<card>-<dtype>.json`` (measured) or ``<model>-analytic.json``.
"""
