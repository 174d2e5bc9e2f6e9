"""hf_specdec.modeling: drafter models (GLIDE, EDD) as PreTrainedModels, registered with the Auto classes."""
