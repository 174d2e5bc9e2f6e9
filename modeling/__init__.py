"""hf_specdec.modeling: drafter models (GLIDE, EDD) as PreTrainedModels, registered with the Auto classes.

``AutoModelForCausalLM.from_pretrained(folder, target=target)`` loads either drafter and attaches it to its target.
Model types are namespaced (``hf_specdec_glide``, ``hf_specdec_edd``) so that no transformers model can collide
with them; checkpoints written under the earlier names (``glide``, ``edd``) still load through the Auto classes,
and are saved under the new names.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from .edd import EddConfig, EddForCausalLM
from .glide import GlideForCausalLM
from .glide_config import GlideConfig


def _legacy(config_cls, model_cls, old_type: str):
    """Config / model subclasses answering to a pre-namespace model type; they save under the current one."""

    def to_dict(self):
        out = config_cls.to_dict(self)
        out["model_type"] = config_cls.model_type
        return out

    def __init__(self, **kwargs):  # explicit: a config subclass without one gets a generic dataclass __init__
        config_cls.__init__(self, **kwargs)

    namespace = {"model_type": old_type, "to_dict": to_dict, "__init__": __init__}
    config = type(f"Legacy{config_cls.__name__}", (config_cls,), namespace)
    model = type(f"Legacy{model_cls.__name__}", (model_cls,), {"config_class": config})
    return config, model


for _config, _model, _old in ((GlideConfig, GlideForCausalLM, "glide"), (EddConfig, EddForCausalLM, "edd")):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)
    _legacy_config, _legacy_model = _legacy(_config, _model, _old)
    AutoConfig.register(_old, _legacy_config, exist_ok=True)
    AutoModelForCausalLM.register(_legacy_config, _legacy_model, exist_ok=True)

__all__ = ["EddConfig", "EddForCausalLM", "GlideConfig", "GlideForCausalLM"]
