import ctypes

from glmrt.engine import native
from glmrt.engine.errors import GlmrtError
from glmrt.model.config import load_model_config
from glmrt.model.native_config import call_with_message, native_model_config


def raise_for_status(status, message):
    if status != native.STATUS_OK:
        raise GlmrtError(status, message)


def plan_ranks(config, num_devices, expert_split="whole"):
    if not 1 <= num_devices <= native.GLMRT_MAX_DEVICES:
        raise ValueError(f"num_devices must be in [1, {native.GLMRT_MAX_DEVICES}], got {num_devices}")
    if expert_split not in native.EXPERT_SPLITS:
        raise ValueError(f"expert_split must be one of {sorted(native.EXPERT_SPLITS)}, got {expert_split!r}")
    library = native.load_library(native.BACKEND_CPU)
    ranks = (native.RankInfoStruct * num_devices)()
    raise_for_status(*call_with_message(library.glmrt_plan_ranks, ctypes.byref(native_model_config(config)),
                                        num_devices, native.EXPERT_SPLITS[expert_split], ranks))
    return [{name: getattr(rank, name) for name, _ in native.RankInfoStruct._fields_} for rank in ranks]


def validate_checkpoint(model_dir, num_hidden_layers=None):
    config = load_model_config(model_dir, num_hidden_layers=num_hidden_layers)
    library = native.load_library(native.BACKEND_CPU)
    raise_for_status(*call_with_message(library.glmrt_checkpoint_validate, str(model_dir).encode(),
                                        ctypes.byref(native_model_config(config))))
    return config
