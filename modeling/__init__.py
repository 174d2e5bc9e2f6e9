"""hf_specdec.modeling: drafter models (GLIDE, EDD) as PreTrainedModels, registered with the Auto classes."""

from transformers import AutoConfig, AutoModelForCausalLM

from .edd import EddConfig, EddForCausalLM
from .glide import GlideForCausalLM
from .glide_config import GlideConfig

AutoConfig.register(GlideConfig.model_type, GlideConfig, exist_ok=True)
AutoModelForCausalLM.register(GlideConfig, GlideForCausalLM, exist_ok=True)
AutoConfig.register(EddConfig.model_type, EddConfig, exist_ok=True)
AutoModelForCausalLM.register(EddConfig, EddForCausalLM, exist_ok=True)

__all__ = ["EddConfig", "EddForCausalLM", "GlideConfig", "GlideForCausalLM"]
