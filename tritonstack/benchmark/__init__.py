"""`tritonstack benchmark`: its scenarios (`.scenario` declares one, `.run` lists them
and runs the one the options ask for) and what they measure with the engine of
tritonstack.measure: the serving stack as ratios side by side (`.serving_ratios`),
regions (`.region_speedup`) and audio (`.audio_cost`)."""
