"""`tritonstack benchmark`: what it measures with the engine of tritonstack.measure:
the serving stack as ratios side by side (`.serving_ratios`), regions
(`.region_speedup`) and audio (`.audio_cost`)."""
