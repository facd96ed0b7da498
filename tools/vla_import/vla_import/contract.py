"""The MolmoAct2 contract between contexts (docs/bundle-format.md) and the bundle settings a
release's tensors imply, cross-checked against the checkpoint's configs."""

import math

from .errors import ImportRefused, expect

from vla_host import build_prompt_tables as bpt  # noqa: E402  (scripts/ is on the path: see __main__)

COMPONENT_IO = {
    "vision": (["pixel_values"], ["image_embeds"]),
    "llm_split": (["hidden_states", "attention_bias"], ["hidden_out", "keys", "values"]),
    "action_context": (["keys", "values"], ["k_ctx", "v_ctx"]),
    "action_step": (["trajectory", "timestep", "k_ctx", "v_ctx", "encoder_attention_mask", "action_dim_is_pad"],
                    ["next_trajectory"]),
}


def kind(name: str) -> str:
    return "llm_split" if name.startswith("llm_split") else name


def check_names(comps: dict) -> list:
    """The components the contract needs, in order; each with exactly the contract's tensors."""
    splits = sorted((c for c in comps if c.startswith("llm_split")), key=lambda c: int(c[len("llm_split"):]))
    expect(bool(splits), "release ctx/", "expected llm_split0.. binaries, found none")
    expect(splits == [f"llm_split{i}" for i in range(len(splits))], "release ctx/",
           f"expected llm_split0..{len(splits) - 1} without gaps, found {splits}")
    order = ["vision"] + splits + ["action_context", "action_step"]
    for name in order:
        expect(name in comps, "release ctx/", f"expected {name}_socid77_archv73.bin, found none")
        c = comps[name]
        ins, outs = COMPONENT_IO[kind(name)]
        for role, want, have in (("input", ins, c.inputs), ("output", outs, c.outputs)):
            expect(sorted(have) == sorted(want), f"{c.binary} {role}s",
                   f"expected {want}, found {sorted(have)}")
    extra = sorted(set(comps) - set(order))
    expect(not extra, "release ctx/", f"components the MolmoAct2 contract has no place for: {extra}")
    return order


def shape(c, tensor):
    return (c.inputs.get(tensor) or c.outputs.get(tensor))[0]


def processor(cfg: dict) -> dict:
    """processor_config.json as lerobot's loader resolves it (build_prompt_tables'
    `processor_settings`: the one implementation), its refusals as the importer's."""
    try:
        return bpt.processor_settings(cfg)
    except bpt.PromptError as exc:
        where, _, what = str(exc).partition(": ")
        raise ImportRefused(where, what) from exc


def settings(comps: dict, order: list, config: dict, proc: dict) -> dict:
    """The molmoact2 block's dimensions, each from the tensors and checked against the configs
    (`proc`: `processor(...)`)."""
    v, a_ctx, step, s0 = comps["vision"], comps["action_context"], comps["action_step"], comps["llm_split0"]
    _, cams, patches, pix = shape(v, "pixel_values")
    tokens, hidden = shape(v, "image_embeds")
    crop, patch = proc["crop_size"], proc["patch_size"]
    expect(patch * patch * 3 == pix, "processor_config.json image_processor.patch_size",
           f"expected {int(math.isqrt(pix // 3))} (pixel_values last dim {pix}), found {patch}")
    expect((crop // patch) ** 2 == patches, "processor_config.json image_processor.size",
           f"expected {int(math.isqrt(patches)) * patch} (pixel_values has {patches} patches), found {crop}")
    _, S, D = shape(s0, "hidden_states")
    L, _, _, kv = shape(s0, "keys")
    tc = config.get("text_config", {})
    splits = len(order) - 3
    for key, want in (("hidden_size", D), ("num_hidden_layers", L * splits),
                      ("num_key_value_heads", kv // max(tc.get("head_dim", 1), 1))):
        expect(tc.get(key) == want, f"config.json text_config.{key}", f"expected {want} (the contexts'), found {tc.get(key)}")
    expect(hidden == D, f"{v.binary} image_embeds", f"width: expected {D} (the LLM's), found {hidden}")
    for name in order[1:-2]:
        c = comps[name]
        expect(shape(c, "hidden_states") == (1, S, D), f"{c.binary} hidden_states",
               f"expected {[1, S, D]}, found {list(shape(c, 'hidden_states'))}")
        expect(shape(c, "keys") == (L, 1, S, kv), f"{c.binary} keys",
               f"expected {[L, 1, S, kv]}, found {list(shape(c, 'keys'))}")
    expect(shape(a_ctx, "keys") == (L * splits, 1, S, kv), f"{a_ctx.binary} keys",
           f"expected {[L * splits, 1, S, kv]}, found {list(shape(a_ctx, 'keys'))}")
    width = shape(a_ctx, "k_ctx")[-1]
    _, H, W = shape(step, "trajectory")
    expect(shape(step, "k_ctx") == shape(a_ctx, "k_ctx"), f"{step.binary} k_ctx",
           f"expected {list(shape(a_ctx, 'k_ctx'))} (action_context's), found {list(shape(step, 'k_ctx'))}")
    expect(shape(step, "encoder_attention_mask") == (1, S), f"{step.binary} encoder_attention_mask",
           f"expected {[1, S]}, found {list(shape(step, 'encoder_attention_mask'))}")
    expect(config.get("max_action_dim") == W, "config.json max_action_dim", f"expected {W} (the trajectory's), found {config.get('max_action_dim')}")
    return {"cameras": cams, "crop_size": crop, "patch_size": patch, "image_tokens": tokens, "seq_len": S,
            "hidden": D, "llm_splits": splits, "layers_per_split": L, "kv_width": kv,
            "action_context_width": width, "action_horizon": H, "action_width": W}


def pooled_grid(proc: dict, tokens_per_camera: int) -> tuple:
    grid = proc["grid"]
    expect(grid[0] * grid[1] == tokens_per_camera, "processor_config.json image_processor.pooling_size",
           f"expected a pooling giving {tokens_per_camera} tokens per camera, found {proc['pooling_size']} "
           f"({grid[0]}x{grid[1]})")
    return grid


def refuse_unsupported(config: dict) -> None:
    """Settings vlad cannot express are refused by name rather than imported wrongly (the
    processor's: `processor`)."""
    expect(config.get("n_obs_steps", 1) == 1, "config.json n_obs_steps",
           f"expected 1 (actions from the chunk's first row), found {config.get('n_obs_steps')}")
    expect(config.get("state_format", "discrete") == "discrete", "config.json state_format",
           f"expected 'discrete', found {config.get('state_format')!r}")
    expect(not config.get("action_expert_depth_gate"), "config.json action_expert_depth_gate",
           "expected false (vlad has no depth gate), found true")
    expect(config.get("num_state_tokens") == 256, "config.json num_state_tokens",
           f"expected 256 (the prompt tables' state rows), found {config.get('num_state_tokens')}")
    expect(config.get("action_mode", "both") in ("both", "continuous"), "config.json action_mode",
           f"expected 'both' or 'continuous', found {config.get('action_mode')!r}")
    refuse_joint_transform(config, "config.json")


def refuse_joint_transform(config: dict, where: str) -> None:
    for key in ("joint_signs", "joint_offsets"):
        expect(config.get(key) is None, f"{where} {key}",
               f"expected null (vlad applies no joint sign/offset transform), found {config.get(key)}")


def refuse_policy(policy: dict, where: str) -> None:
    """A LeRobot policy config's own settings (they override the model config's)."""
    expect(policy.get("type", "molmoact2") == "molmoact2", f"{where} type",
           f"expected 'molmoact2', found {policy.get('type')!r}")
    expect(policy.get("n_obs_steps", 1) == 1, f"{where} n_obs_steps",
           f"expected 1 (actions from the chunk's first row), found {policy.get('n_obs_steps')}")
    expect(policy.get("num_state_tokens", 256) == 256, f"{where} num_state_tokens",
           f"expected 256 (the prompt tables' state rows), found {policy.get('num_state_tokens')}")
    expect(policy.get("action_mode", "continuous") in ("both", "continuous"), f"{where} action_mode",
           f"expected 'both' or 'continuous', found {policy.get('action_mode')!r}")
    expect(policy.get("inference_action_mode") in (None, "continuous"), f"{where} inference_action_mode",
           f"expected 'continuous' (vlad runs the flow-matching expert), found {policy.get('inference_action_mode')!r}")
    refuse_joint_transform(policy, where)


PROMPT_SETTINGS = ("add_setup_tokens", "add_control_tokens", "normalize_language")


def prompt_settings(*sources: dict) -> dict:
    """The template settings the checkpoint renders its prompt with, from the first source that
    has each (a LeRobot pack step, its policy config; a Hugging Face model config), else true,
    upstream's default. `normalize_language` is a `predict_action` argument (default true) for a
    Hugging Face checkpoint, not a config key."""
    out = {}
    for key in PROMPT_SETTINGS:
        value = next((s[key] for s in sources if s.get(key) is not None), True)
        expect(isinstance(value, bool), key, f"expected true or false, found {value!r}")
        out[key] = value
    return out
