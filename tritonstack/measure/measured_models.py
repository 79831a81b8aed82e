"""The models the tools measure, named as the build names them (tritonstack.contract)."""

from __future__ import annotations

from tritonstack import contract

CLASSIFIER = "efficientnet_lite0"


DALI_PRESET = contract.DEFAULT_PRESET


PIL_PRESET = f"python_{CLASSIFIER}"


INT8_PRESET = f"{DALI_PRESET}_int8"


INT8_CLASSIFIER = f"{CLASSIFIER}_int8"


DALI_PREPROCESS = contract.preprocessing_name(DALI_PRESET)


PIL_PREPROCESS = contract.preprocessing_name(PIL_PRESET)


DALI_ENSEMBLE = contract.ensemble_name(DALI_PRESET)


PIL_ENSEMBLE = contract.ensemble_name(PIL_PRESET)


INT8_ENSEMBLE = contract.ensemble_name(INT8_PRESET)
