"""Load and validate one rig file plus the catalog entries it serves.

Data flows one way: YAML files -> `load_rig()` -> frozen objects (`rigkit.config.schema`).
Nothing downstream reads raw YAML or pyinfra's host.data again. Validation is complete
before any host is touched; `ConfigError` lists every problem at once, each with
its file, line, field, value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from rigkit.config.defaults import DEFAULT_CATALOG_DIR
from rigkit.config.errors import ConfigError, Problem
from rigkit.config.lint import serving_findings
from rigkit.config.names import name_problem
from rigkit.config.schema import ModelConfig, ModelSpec, RigConfig, RigSpec
from rigkit.config.variants import choose_variant
from rigkit.config.yamlfile import Location, format_location, load_yaml


def load_rig(rig_file: Path | str, catalog_dir: Path | str) -> RigConfig:
    """Load and validate one rig file and every catalog entry it serves."""
    rig_file, catalog_dir = Path(rig_file), Path(catalog_dir)
    spec = _validate(RigSpec, rig_file)
    models, notes, problems = [], [], _file_name_problems(rig_file, "rig") + _serve_address_problems(spec, rig_file)
    problems += _accepted_keys_problems(spec, rig_file)
    for position, name in enumerate(spec.models):
        model_file = catalog_dir / f"{name}.yml"
        if not (model_file.is_file() or model_file.is_symlink() or model_file.exists()):
            available = ", ".join(sorted(p.stem for p in catalog_dir.glob("*.yml"))) or "none"
            problems.append(
                Problem(rig_file, f"models[{position}]", name, f"no catalog file {model_file}; available: {available}")
            )
            continue
        try:
            model = load_model(model_file)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if model.variants:
            chosen, said = choose_variant(spec, model)
            if chosen is None:
                problems.append(Problem(model_file, "variants", None, said))
                continue
            model, notes = chosen, [*notes, said]
        models.append(model)
    problems += _monitoring_port_problems(spec, rig_file, models)
    if not problems:
        models, found = on_demand_models(spec, rig_file, models)
        problems += found
    if problems:
        raise ConfigError(problems)
    errors, warnings = serving_findings(spec, rig_file, models)
    if errors:
        raise ConfigError(errors)
    return RigConfig(rig_file.stem, spec, tuple(models), rig_file, tuple(warnings), tuple(notes))


def on_demand_models(spec: RigSpec, rig_file: Path, models: list[ModelConfig]) -> tuple[list[ModelConfig], list[Problem]]:
    """`models` with the rig file's on_demand attached (engine_port resolved), and what is wrong with it: a model
    the rig does not serve, one named twice, an engine port another model, engine or monitoring port has."""
    wanted = {}
    for n, entry in enumerate(spec.on_demand.models):
        wanted.setdefault(entry.name, (n, entry))  # the first entry of a name counts; a later one is refused
    problems = []
    for n, entry in enumerate(spec.on_demand.models):
        where = f"on_demand.models[{n}].name"
        if entry.name not in {m.name for m in models}:
            problems.append(Problem(rig_file, where, entry.name, f"not one of this rig's models ({', '.join(spec.models)})"))
        elif wanted[entry.name][0] != n:
            problems.append(Problem(rig_file, where, entry.name, "listed twice; once per model"))
    taken = {m.spec.port: f"the port of model {m.name}" for m in models}
    if spec.monitoring.enabled:
        taken[spec.monitoring.exporter_port] = "monitoring.exporter_port"
        if spec.monitoring.prometheus:
            taken[spec.monitoring.prometheus_port] = "monitoring.prometheus_port"
    result = []
    for model in models:
        if model.name not in wanted:
            result.append(model)
            continue
        n, entry = wanted[model.name]
        if entry.swap == "checkpoint" and len(model.spec.gpus) > 1:
            problems.append(Problem(rig_file, f"on_demand.models[{n}].swap", entry.swap,
                                    f"{model.name} spans GPUs ({model.spec.gpus}): cuda-checkpoint does not move the "
                                    "memory its processes share (NCCL); a model on one GPU only, else sleep or stop"))
        port = entry.engine_port or (model.spec.port + 10000 if model.spec.port + 10000 <= 65535 else model.spec.port - 10000)
        if port in taken:
            problems.append(Problem(rig_file, f"on_demand.models[{n}].engine_port", port,
                                    f"port {port} is {taken[port]}; give {model.name}'s engine a port of its own"))
        taken[port] = f"the engine port of on-demand model {model.name}"
        result.append(dataclasses.replace(model, on_demand=entry.model_copy(update={"engine_port": port})))
    return result, problems


def _monitoring_port_problems(spec: RigSpec, rig_file: Path, models: list[ModelConfig]) -> list[Problem]:
    """The exporter and Prometheus listen on the rig's 127.0.0.1 beside the models: a port each."""
    monitoring = spec.monitoring
    if not monitoring.enabled:
        return []
    ports = {monitoring.exporter_port: "exporter_port"}
    if monitoring.prometheus:
        ports[monitoring.prometheus_port] = "prometheus_port"
    return [Problem(rig_file, f"monitoring.{field}", model.spec.port,
                    f"port {model.spec.port} is also the port of model {model.name} ({model.file}); pick another")
            for model in models for port, field in ports.items() if model.spec.port == port]


def _accepted_keys_problems(spec: RigSpec, rig_file: Path) -> list[Problem]:
    if not spec.accept_api_key_files:
        return []
    if spec.os == "windows":
        return [Problem(rig_file, "accept_api_key_files", spec.accept_api_key_files,
                        "not built for Windows rigs yet (their models take one key); remove the field")]
    if not spec.api_key_file:
        return [Problem(rig_file, "accept_api_key_files", spec.accept_api_key_files,
                        "keys accepted besides api_key_file need api_key_file, the one rigkit sends")]
    return []


def _serve_address_problems(spec: RigSpec, rig_file: Path) -> list[Problem]:
    """Models reachable from the network must require a key: anyone who reaches the port could use
    the GPUs otherwise."""
    if spec.serve_address == "127.0.0.1":
        return []
    if spec.os == "windows":
        return [Problem(rig_file, "serve_address", spec.serve_address,
                        "Windows rigs serve on 127.0.0.1 only (the gateway sends no key to their models yet); remove the field")]
    if not spec.api_key_file:
        return [Problem(rig_file, "serve_address", spec.serve_address,
                        "models listening on every interface need an API key: set api_key_file (a file of mode 600 "
                        "holding the key), or serve_address: 127.0.0.1")]
    return []


def default_catalog_dir(rig_file: Path) -> Path:
    """The catalog beside the rig file's folder (inventory/rigs/x.yml -> inventory/models), so
    `rigkit check` works from any directory; else the deploy's default, from the current one."""
    beside = rig_file.resolve().parent.parent / "models"
    return beside if rig_file.resolve().parent.name == "rigs" and beside.is_dir() else Path(DEFAULT_CATALOG_DIR)


# A catalog's variants of one model (docs/serving.md, "Variants"): what each may set. `vllm` and `env` add to the
# model's own; the others replace it.
VARIANT_KEYS = ("image", "image_requires", "weights", "vllm", "env", "weight_bytes", "active_weight_bytes",
                "expected_min_decode_tok_s")
VARIANT_MERGED = ("vllm", "env")
MAX_VARIANTS = 8
VARIANT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")


def load_model(model_file: Path | str) -> ModelConfig:
    model_file = Path(model_file)
    data, lines = _mapping(ModelSpec, model_file)
    problems = _file_name_problems(model_file, "model")
    if "variants" not in data:
        spec = _validate_data(ModelSpec, model_file, data, lines)
        if problems:
            raise ConfigError(problems)
        return ModelConfig(model_file.stem, spec, model_file)
    variants = _variants(model_file, data, lines)
    if problems:
        raise ConfigError(problems)
    return ModelConfig(model_file.stem, variants[0][1], model_file, variants)


def _variants(path: Path, data: dict, lines: dict) -> tuple[tuple[str, ModelSpec], ...]:
    """Each variant as the model's whole spec: the file's keys, then the variant's (vllm and env added to)."""
    raw, base = data["variants"], {k: v for k, v in data.items() if k != "variants"}
    line = lines.get(("variants",))
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_VARIANTS or not all(isinstance(v, dict) for v in raw):
        raise ConfigError([Problem(path, "variants", None, f"a list of 1 to {MAX_VARIANTS} mappings, each a name and "
                                                          f"what that variant sets: {', '.join(VARIANT_KEYS)}", line)])
    found, problems, names = [], [], set()
    for n, variant in enumerate(raw):
        at = lines.get(("variants", n), line)
        name = variant.get("name")
        if not isinstance(name, str) or not VARIANT_NAME.fullmatch(name) or name in names:
            problems.append(Problem(path, f"variants[{n}].name", name if isinstance(name, str) else None,
                                    "each variant needs a name of its own: 1-32 lowercase letters, digits, '.', '_', "
                                    "'-', starting with a letter or digit", at))
            continue
        names.add(name)
        unknown = sorted(k for k in variant if k != "name" and k not in VARIANT_KEYS)
        if unknown:
            problems.append(Problem(path, f"variants[{n}].{unknown[0]}", None,
                                    f"a variant may set only: name, {', '.join(VARIANT_KEYS)}", at))
            continue
        merged = dict(base)
        for key, value in variant.items():
            if key in VARIANT_MERGED and isinstance(value, dict) and isinstance(base.get(key), dict):
                merged[key] = {**base[key], **value}
            elif key != "name":
                merged[key] = value
        try:
            found.append((name, ModelSpec.model_validate(merged)))
        except ValidationError as exc:
            for error in exc.errors():
                problem = _problem(ModelSpec, path, error, lines)
                loc = tuple(error["loc"])
                from_variant = loc[:1] and loc[0] in variant
                problems.append(Problem(path, f"variants[{n}].{problem.field}" if from_variant else problem.field,
                                        problem.value, f"{problem.message} (variant {name})",
                                        lines.get(("variants", n, *loc), problem.line) if from_variant else problem.line))
    if problems:
        raise ConfigError(problems)
    return tuple(found)


def _file_name_problems(path: Path, what: str) -> list[Problem]:
    """A rig's or model's name is its file's stem, and it must follow the name rule."""
    problem = name_problem(path.stem)
    if problem is None:
        return []
    return [Problem(path, "", path.stem, f"the {what}'s name is its file name without .yml; {problem}")]


def _mapping(schema: type[BaseModel], path: Path) -> tuple[dict, dict]:
    data, lines = load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        # Not echoed: a file that is not YAML (a symlink to /etc/passwd) must not be printed back.
        what = "rig" if schema is RigSpec else "model catalog"
        raise ConfigError([Problem(path, "", None, f"not a YAML mapping (it is {_yaml_kind(data)}); a {what} "
                                                   "file is `key: value` lines, e.g. `os: linux`", 1)])
    return data, lines


def _validate_data(schema: type[BaseModel], path: Path, data: dict, lines: dict) -> Any:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_problem(schema, path, error, lines) for error in exc.errors()]) from None


def _validate(schema: type[BaseModel], path: Path) -> Any:
    return _validate_data(schema, path, *_mapping(schema, path))


def _yaml_kind(data: Any) -> str:
    return {str: "text", list: "a list", int: "a number", float: "a number", bool: "true/false"}.get(type(data), "a value")


def _problem(schema: type[BaseModel], path: Path, error: dict, lines: dict[Location, int]) -> Problem:
    loc = tuple(error["loc"])
    line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), None)
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if error["type"] == "extra_forbidden":
        allowed = ", ".join(_fields_at(schema, loc[:-1]))
        message = f"unknown key (a typo?); allowed here: {allowed}"
        value = None
    elif error["type"] == "missing":
        message = "required field is missing"
        value = None
    elif isinstance(value, dict) and error["type"] != "value_error":
        value = None  # the field names it; a whole mapping in the message helps nobody (a list is cut)
    return Problem(path, format_location(loc), value, message, line)


def _fields_at(schema: type[BaseModel], loc: Location) -> list[str]:
    """The keys a schema allows at a location, for 'unknown key' messages."""
    model: Any = schema
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = model.model_fields[part].annotation
        model = next(_models_in(annotation), None)
        if model is None:
            return []
    return list(model.model_fields)


def _models_in(annotation: Any):
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)
