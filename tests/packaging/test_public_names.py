"""Nothing moves for a user (issue 36 item 5): the public names of ``hasfl_ray/__init__.py``, every import path the
documentation (docs/, README.md, examples/) and the scripts beside the package (docs/reproduction/, benchmarks/) use,
and every name the files split by issue 36 held, still import; and every file of hasfl_ray/ opens with a docstring
whose first line says what it is for.

The lists are literal, so that a move which breaks a documented path fails here; the documentation is scanned too,
so that a path documented later joins the lists.
"""

import ast
import glob
import importlib
import os
import re

import pytest

import hasfl_ray

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(REPO, "hasfl_ray")

#: hasfl_ray's public names (its ``__all__``; docs/layout.md's first row of the package table).
PUBLIC_NAMES = ("AggregateResult", "aggregate_updates", "__version__", "Algorithm", "ClientResult", "LocalObjective",
                "Dataset", "FederatedDataset", "TensorFederatedDataset", "RunConfig", "register_algorithm",
                "register_dataset", "simulate", "load_run", "RunResult", "Callback", "EarlyStopping", "Stop")

#: ``from MODULE import NAME`` in docs/*.md, README.md, examples/ and docs/reproduction/*.py.
DOCUMENTED_IMPORTS = {
    "hasfl_ray": ("Algorithm", "Dataset", "TensorFederatedDataset"),
    "hasfl_ray.aggregation": ("IndexedUpdate", "MaskedUpdate", "aggregate_updates"),
    "hasfl_ray.callbacks": ("Callback", "EarlyStopping", "Stop"),
    "hasfl_ray.models.index_slicing": ("extract_indexed", "extract_masked", "index_sets", "random_channel_sets"),
    "hasfl_ray.training.seeding": ("torch_generator",),
    "hasfl_ray.analysis": ("read_run",),
    "hasfl_ray.analysis.clocked": ("clock_table", "first_reached", "plot_clock"),
    "hasfl_ray.analysis.plots": ("figure_heading", "plot_runs", "read_metrics"),
    "hasfl_ray.analysis.statistics": ("paired_comparison",),
    "hasfl_ray.analysis.report": ("CONFOUND_COLUMNS", "CONFOUND_KEYS", "analyze_runs", "confound_latex",
                                  "confound_markdown", "display_name", "grid_csv", "run_groups", "run_option",
                                  "summarise_runs", "table_csv",
                                  "table_latex", "table_markdown"),
    "hasfl_ray.data": ("dirichlet_partition",),
    "hasfl_ray.engine.coverage": ("coverage_warning",),
    "hasfl_ray.errors": ("ConfigError", "DataError"),
    "hasfl_ray.evaluation": ("evaluation_round",),
    "hasfl_ray.federation": ("ladder_of",),
    "hasfl_ray.flower": ("Strategy", "client_fn"),
    "hasfl_ray.models": ("build_model", "cost_table", "resnet_cost_table", "width_channels"),
    "hasfl_ray.models.plugin": ("derive_specs", "describe", "load_factory"),
    "hasfl_ray.registry": ("register_algorithm",),
    "hasfl_ray.training.determinism": ("machine_type",),
}

#: Dotted paths (modules, or a module's attribute) named in docs/**/*.md, README.md and examples/.
DOCUMENTED_PATHS = (
    "hasfl_ray.Algorithm", "hasfl_ray.Arrival", "hasfl_ray.Dataset", "hasfl_ray.aggregate_updates",
    "hasfl_ray.aggregation", "hasfl_ray.aggregation.packed.pack_bits", "hasfl_ray.models.index_slicing",
    "hasfl_ray.models.index_slicing.channel_groups", "hasfl_ray.models.index_slicing.extract_masked",
    "hasfl_ray.simulate", "hasfl_ray.load_run", "hasfl_ray.callbacks", "hasfl_ray.callbacks.Callback",
    "hasfl_ray.evaluation", "hasfl_ray.evaluation.evaluation_round", "hasfl_ray.algorithms.base",
    "hasfl_ray.results", "hasfl_ray.trackers", "hasfl_ray.data.flower.column_array",
    "hasfl_ray.clock.cost.index_list_bytes", "hasfl_ray.engine.depth_eval.evaluated_network",
    "hasfl_ray.data.flower.natural_id_partition",
    "hasfl_ray.analysis", "hasfl_ray.analysis.clocked", "hasfl_ray.analysis.plots", "hasfl_ray.analysis.report",
    "hasfl_ray.cli.entry",
    "hasfl_ray.cli.main", "hasfl_ray.cli.reference", "hasfl_ray.cli.sections",
    "hasfl_ray.config.default_backend", "hasfl_ray.config.migrate_config", "hasfl_ray.data",
    "hasfl_ray.data.partition_labels", "hasfl_ray.engine.coverage", "hasfl_ray.engine.factory.make_backend",
    "hasfl_ray.engine.handoff.HandoffBackend", "hasfl_ray.errors", "hasfl_ray.errors.ConfigError",
    "hasfl_ray.federation", "hasfl_ray.flower", "hasfl_ray.flower.Strategy", "hasfl_ray.aggregation.aggregate_updates",
    "hasfl_ray.files.open_regular", "hasfl_ray.files.ownership_problem",
    "hasfl_ray.files.read_json", "hasfl_ray.files.read_regular",
    "hasfl_ray.training.task.ExitsObjective",
    "hasfl_ray.models", "hasfl_ray.models.cost_table", "hasfl_ray.models.extract", "hasfl_ray.models.pads_exactly",
    "hasfl_ray.models.plugin", "hasfl_ray.models.plugin.describe", "hasfl_ray.models.resnet.StaticBatchNorm2d",
    "hasfl_ray.models.slicing.extract", "hasfl_ray.models.width_channels", "hasfl_ray.ops.aggregate_fused",
    "hasfl_ray.analysis.statistics", "hasfl_ray.analysis.statistics.paired_comparison",
    "hasfl_ray.registry", "hasfl_ray.schedule.round_lr", "hasfl_ray.simulation.connect_ray",
    "hasfl_ray.training.determinism",
    "hasfl_ray.training.determinism.machine_type", "hasfl_ray.training.seeding",
    "hasfl_ray.training.seeding.sample_participants",
)
#: Names the documentation gives that are no Python path: the compiled extension (tests/aggregation import it where
#: it is built) and csrc/'s file hasfl_ray.cpp.
NOT_PYTHON_PATHS = ("hasfl_ray._C", "hasfl_ray.cpp")

#: ``from MODULE import NAME`` in benchmarks/*.py.
SCRIPT_IMPORTS = {
    "hasfl_ray": ("Dataset",),
    "hasfl_ray.aggregation": ("aggregate_reference", "validate_inputs"),
    "hasfl_ray.bench.aggregate": ("make_federation",),
    "hasfl_ray.cli.bench": ("aggregate",),
    "hasfl_ray.cli.main": ("main",),
    "hasfl_ray.clock": ("Clock", "WidthCosts", "clock", "draw_profiles", "make_availability"),
    "hasfl_ray.clock.spec": ("normalise_devices",),
    "hasfl_ray.data": ("FederatedDataset", "assign_tiers", "load_dataset"),
    "hasfl_ray.data.base": ("Dataset", "TensorFederatedDataset", "TextFederatedDataset"),
    "hasfl_ray.data.digits": ("load_digits_federated",),
    "hasfl_ray.data.partition": ("dirichlet_partition", "partition_labels"),
    "hasfl_ray.data.synthetic": ("load_synthetic",),
    "hasfl_ray.engine": ("Engine", "LocalBackend", "RunConfig", "engine", "server"),
    "hasfl_ray.engine.engine": ("Engine", "STREAM_TIERS", "initial_parameters", "sample_participants"),
    "hasfl_ray.engine.server": ("Server",),
    "hasfl_ray.models": ("MODEL_CONFIGS", "build_model", "extract"),
    "hasfl_ray.ops": ("aggregate",),
    "hasfl_ray.simulation": ("quiet_token_notice",),
    "hasfl_ray.sweep": ("plan_sweep",),
    "hasfl_ray.training": ("local",),
    "hasfl_ray.training.batched": ("group_tasks", "train_batched"),
    "hasfl_ray.training.determinism": ("apply_determinism",),
    "hasfl_ray.training.evaluate": ("evaluate",),
    "hasfl_ray.training.local": ("ClientTask", "OptimizerSettings", "Trainer"),
    "hasfl_ray.training.seeding": ("STREAM_CLIENT", "numpy_rng", "torch_generator"),
}

#: The names the modules issue 36 splits held before the split (each stays importable from its former home).
FORMER_HOMES = {
    "hasfl_ray.engine.config": (
        "AliasExpansionError", "CONFIG_VERSION", "DEFAULT_MOMENTUM", "DuplicateKeyError", "EVAL_EVERY",
        "EXECUTION_FIELDS", "FAULT_KINDS", "LEGACY_OPTION_KEYS", "MAX_ALIAS_EXPANSION", "MODEL_CHOICES", "MODEL_NORMS",
        "PROTOCOL_FIELDS", "RunConfig", "SWEEP_FIELDS", "SWEEP_KEY", "StrictLoader", "auto_training_modes",
        "check_alias_expansion", "check_algorithm_options", "default_backend", "fault_inject_round",
        "load_yaml_config", "merge_layers", "migrate_config", "option_fields", "option_owners", "parse_fault",
        "ray_installed", "route_options", "single_run_values", "split_sweep_config", "strict_yaml_load",
        "sweep_list"),
    "hasfl_ray.engine": ("Backend", "Engine", "LocalBackend", "RunConfig", "Server"),
    "hasfl_ray.engine.engine": (
        "CLIENT_ROWS_CHUNK", "Engine", "MAX_PENDING_LINES", "STREAM_TIERS", "TEXT_LOCAL_ACCURACY", "capacity_tiers",
        "check_device", "check_threads", "initial_parameters", "round_capacities", "sample_participants"),
    "hasfl_ray.analysis": ("analyze_runs", "confound_correlations", "partial_correlation", "read_run",
                           "summarise_runs", "write_analysis"),
    "hasfl_ray.analysis.report": (
        "ALGORITHM_TYPES", "ALPHA", "CONFOUND_COLUMNS", "CONFOUND_KEYS", "DATASET_NAMES", "DISPLAY_NAMES",
        "LOCAL_CLIENT_COLUMNS", "LOCAL_KEYS", "LOCAL_STATISTICS", "LOCAL_WIDTHS", "NOT_RECORDED", "NO_CLIENT_SCORED",
        "NUMERIC_CLIENT_COLUMNS", "TABLE_COLUMNS", "WIDTHS_EXPECTED", "algorithm_type", "analyze_runs",
        "check_number_map", "check_width_map", "confound_correlations", "confound_latex", "confound_markdown",
        "confound_statistics", "confound_verdict", "correlation_test", "display_name", "grid_csv", "grid_latex",
        "grid_markdown", "mean_std", "number", "omitted_lines", "partial_correlation", "partial_correlation_test",
        "protocol_line", "read_clients", "read_run", "run_groups", "run_option", "summarise_runs", "table_csv",
        "table_latex", "table_markdown", "width_of", "width_tables", "write_analysis"),
    "hasfl_ray.simulation.backend": (
        "CALLS_PER_TRAINER", "INLINE_OBJECT_BYTES", "MAX_ATTEMPTS", "OBJECT_STORE_BYTES", "RayBackend", "RoundTiming", "TASKS_IN_FLIGHT",
        "UNITS_PER_CALL", "calls", "evaluation_cost"),
    "hasfl_ray.bench.aggregate": (
        "Aggregator", "CaseResult", "Federation", "MODELS", "PEAK_PER_PACKED_BYTE", "Shapes", "TORCH_IMPLEMENTATIONS",
        "Timing", "Updates", "aggregate_dense", "aggregate_heterofl_loop", "aggregate_torch_per_client",
        "aggregate_torch_sliced", "aggregate_torch_stacked", "bandwidth_probes", "bytes_per_client",
        "check_case_memory", "implementations", "make_federation", "run_case"),
    "hasfl_ray.models.plugin": (
        "CONTRACT", "INPUT_ARGUMENTS", "LAYER_BLOCKS", "PROBE_WIDTHS", "accepted_arguments", "build_plugin",
        "check_buffers", "check_names", "check_specs", "check_width", "dataset_arguments", "declared_blocks",
        "derive_specs", "describe", "is_plugin_kind", "load_factory", "measured_macs", "model_name",
        "normalise_config", "plugin_config", "slice_specs"),
}

#: Modules that import Ray (the test of their names needs it installed).
NEEDS_RAY = {"hasfl_ray.simulation.backend"}


def import_from(module, name):
    """What ``from module import name`` gives (a submodule too)."""
    namespace = {}
    exec(f"from {module} import {name}", namespace)  # noqa: S102 (the statement under test, literally)
    return namespace[name]


def resolve(path):
    """The object a dotted path names: its longest importable module prefix, then attributes."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        try:
            value = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and name.startswith(error.name) and error.name.startswith("hasfl_ray"):
                continue
            raise
        for attribute in parts[end:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(path)


def pairs(table):
    return [(module, name) for module, names in table.items() for name in names]


def test_the_public_names_are_those_of_all_and_import():
    assert set(PUBLIC_NAMES) <= set(hasfl_ray.__all__)
    for name in PUBLIC_NAMES:
        assert getattr(hasfl_ray, name) is import_from("hasfl_ray", name)


@pytest.mark.parametrize("module, name", pairs(DOCUMENTED_IMPORTS) + pairs(SCRIPT_IMPORTS))
def test_a_documented_import_works(module, name):
    import_from(module, name)


@pytest.mark.parametrize("path", DOCUMENTED_PATHS)
def test_a_documented_path_resolves(path):
    resolve(path)


@pytest.mark.parametrize("module, name", pairs(FORMER_HOMES))
def test_a_name_of_a_split_module_stays_importable_from_its_former_home(module, name):
    if module in NEEDS_RAY:
        pytest.importorskip("ray")
    import_from(module, name)


def documentation():
    """(path, text) of docs/**/*.md, README.md, examples/ and docs/**/*.py."""
    paths = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True) + [os.path.join(REPO, "README.md")]
    paths += glob.glob(os.path.join(REPO, "examples", "**", "*.py"), recursive=True)
    paths += glob.glob(os.path.join(REPO, "docs", "**", "*.py"), recursive=True)
    return [(path, open(path, encoding="utf-8").read()) for path in sorted(paths)]


FROM_IMPORT = re.compile(r"from (hasfl_ray[\w.]*) import (\([^)]*\)|[\w, ]+)")
DOTTED = re.compile(r"(?<![\w.])hasfl_ray(?:\.\w+)+")


def documented_imports(path, text):
    if path.endswith(".py"):
        return {(node.module, alias.name) for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom)
                and node.level == 0 and (node.module or "").split(".")[0] == "hasfl_ray" for alias in node.names}
    found = set()
    for module, names in FROM_IMPORT.findall(text):
        for name in names.strip("()").split(","):
            name = name.split(" as ")[0].strip()
            if name:
                found.add((module, name))
    return found


def test_every_import_and_path_the_documentation_gives_is_listed_here():
    """A path newly documented joins DOCUMENTED_IMPORTS or DOCUMENTED_PATHS (and so stays tested)."""
    imports, paths = set(), set()
    for path, text in documentation():
        imports |= documented_imports(path, text)
        paths |= set(DOTTED.findall(text))
    assert sorted(imports - set(pairs(DOCUMENTED_IMPORTS))) == []
    assert sorted(paths - set(DOCUMENTED_PATHS) - set(NOT_PYTHON_PATHS)) == []


def test_every_file_of_the_package_opens_with_a_docstring_saying_what_it_is_for():
    missing = []
    for path in sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as file:
            source = file.read()
        docstring = ast.get_docstring(ast.parse(source), clean=False)
        opening = next((line for line in source.splitlines() if line.strip()), "")
        if not docstring or not docstring.splitlines()[0].strip() or not opening.startswith(('"""', "'''")):
            missing.append(os.path.relpath(path, REPO))
    assert missing == []
