"""Reading YAML strictly: no key given twice, alias expansion bounded, regular files only, ``5e-2`` a float; one
sentence if bad. ``--algo-opt KEY=VALUE`` reads its values with the same loader."""

from __future__ import annotations

import io
import re
from typing import Any, Dict, List, Tuple

import yaml

from hasfl_ray.errors import ConfigError, DataError
from hasfl_ray.files import open_regular


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping names one key twice (plain YAML would keep the last value without a word)."""

    def __init__(self, key: Any, mark: Any):
        super().__init__(problem=f"found the key {key!r} twice", problem_mark=mark)
        self.key = key


#: The most values a YAML file's aliases (``*name``) may add by repeating what their anchors (``&name``) name: a
#: config that repeats a block of settings a few times stays far below it, while an alias bomb (ten lines, each
#: repeating the line before nine times: 9^9 values, gigabytes once anything walks or prints them) is refused
#: before a value is built.
MAX_ALIAS_EXPANSION = 100_000


class AliasExpansionError(yaml.composer.ComposerError):
    """A YAML document whose aliases expand beyond :data:`MAX_ALIAS_EXPANSION` values, or name a node that holds
    them (a structure that contains itself)."""

    def __init__(self, problem: str, mark: Any):
        super().__init__(problem=problem, problem_mark=mark)


def _yaml_children(node: yaml.Node) -> List[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def check_alias_expansion(root: yaml.Node) -> None:
    """Raise :class:`AliasExpansionError` when the composed document ``root`` holds more than
    :data:`MAX_ALIAS_EXPANSION` values beyond its own nodes once every alias is expanded, or an alias inside the
    node it names. The composer shares an aliased node (the file stays small in memory); the count walks that graph
    once, iteratively, each node's expanded size computed from its children's."""
    sizes: Dict[int, int] = {}
    open_nodes = set()
    stack: List[Tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = min(1 + sum(sizes[id(child)] for child in _yaml_children(node)), 1 << 62)
            if sizes[key] > MAX_ALIAS_EXPANSION + len(sizes):
                raise AliasExpansionError(f"its aliases expand to more than {MAX_ALIAS_EXPANSION:,} values",
                                          node.start_mark)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise AliasExpansionError("an alias is used inside the value it names", node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _yaml_children(node) if id(child) not in sizes)


class StrictLoader(yaml.SafeLoader):
    """The safe loader (plain values only), refusing a mapping that repeats a key: ``lr: 0.05`` then ``lr: 5.0``
    is a mistake to name, not a value to pick. Keys brought in by a ``<<`` merge may still be overridden. Alias
    expansion is bounded (:func:`check_alias_expansion`): a small file never becomes a large value."""

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            check_alias_expansion(node)
        return node


def _construct_unique_mapping(loader: StrictLoader, node: yaml.MappingNode):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            repeated = key in seen
        except TypeError:  # an unhashable key: the safe loader's own error says so
            break
        if repeated:
            raise DuplicateKeyError(key, key_node.start_mark)
        seen.add(key)
    yield from loader.construct_yaml_map(node)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)

#: Scientific notation without a dot or without an exponent sign (``5e-2``, ``2.0e8``, ``1E6``): a float in YAML 1.2
#: and in every config a user writes, a string to PyYAML's YAML 1.1 resolver (which wants ``5.0e-2``, ``2.0e+8``).
#: Added to this loader only (PyYAML copies the resolver table for a subclass), after the built-in ones, so an int,
#: a 1.1 float or a timestamp reads as before.
SCIENTIFIC_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", SCIENTIFIC_FLOAT, list("-+0123456789"))


def strict_yaml_load(stream: Any) -> Any:
    """``yaml.safe_load`` that refuses a repeated key (:class:`DuplicateKeyError`) and an alias bomb
    (:class:`AliasExpansionError`); a document nested too deeply for the parser is a ``yaml.YAMLError`` too."""
    try:
        return yaml.load(stream, Loader=StrictLoader)
    except RecursionError:  # [[[[...]]]] thousands deep: the composer recurses once a level
        raise yaml.YAMLError("it is nested too deeply to read") from None


def parse_option_assignments(assignments: Any) -> Dict[str, Any]:
    """``["key=value", ...]`` (``--algo-opt``) to a mapping; each value is read as a YAML scalar by the config files'
    own loader (:class:`StrictLoader`: ``0.5``, ``5e-2``, ``3``, ``true``, text), so a flag reads a number as a
    config file does. Anything else (a list, a mapping, aliases) stays the text it was, never expanded (an alias
    bomb in one flag would be built before being dropped)."""
    out: Dict[str, Any] = {}
    given: Dict[str, str] = {}
    for item in assignments or ():
        key, sep, raw = str(item).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ConfigError(f"--algo-opt is {item!r}; expected KEY=VALUE, such as --algo-opt min_width=0.3")
        if key in given:  # the last one kept in silence, where a config file refuses a key given twice
            raise ConfigError(f"--algo-opt gives {key!r} twice ({given[key]!r} and {str(item)!r}); expected each "
                              "option once")
        given[key] = str(item)
        try:
            node = yaml.compose(raw, Loader=StrictLoader) if raw.strip() else None
            value = yaml.load(raw, Loader=StrictLoader) if isinstance(node, yaml.ScalarNode) else \
                raw if node is not None else ""
        except (yaml.YAMLError, RecursionError):
            value = raw
        out[key] = value if isinstance(value, (int, float, str, bool)) or value is None else raw
    return out


def load_yaml_config(path: str) -> Dict[str, Any]:
    """Read a YAML mapping of config keys (the run and sweep configs alike); one sentence on an unreadable, non-UTF-8
    or malformed file, an object tag, or a key given twice."""
    try:
        handle = open_regular(path, "config file")  # a FIFO or a device: refused before a byte is read
    except DataError as error:
        if not isinstance(error.__cause__, OSError):
            raise
        raise ConfigError(f"config file {path!r} cannot be read ({error.__cause__.strerror}); expected a readable "
                          "YAML file") from None
    try:
        with io.TextIOWrapper(handle, encoding="utf-8") as text:
            values = strict_yaml_load(text)
    except OSError as error:
        raise ConfigError(f"config file {path!r} cannot be read ({error.strerror}); expected a readable YAML file")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path!r} is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
                          f"{error.start}); expected a YAML file of config keys") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        if isinstance(error, DuplicateKeyError):
            raise ConfigError(f"config file {path!r} gives the key {error.key!r} twice{where}; expected each key "
                              "once") from None
        if isinstance(error, AliasExpansionError):
            raise ConfigError(f"config file {path!r} is refused: {error.problem}{where}; expected YAML whose "
                              "aliases (*name) repeat a few blocks of settings at most") from None
        if type(error) is yaml.YAMLError:  # strict_yaml_load's own: nested too deeply
            raise ConfigError(f"config file {path!r} cannot be read ({error}); expected a mapping of config keys") \
                from None
        tag = re.search(r"for the tag '([^']+)'", str(getattr(error, "problem", "")))
        if tag:  # the safe loader builds plain values only: an object tag is refused, never constructed
            raise ConfigError(f"config file {path!r} uses the tag {tag.group(1)!r}{where}, which is never loaded; "
                              "expected plain YAML values") from None
        raise ConfigError(f"config file {path!r} is not valid YAML{where}; expected a mapping of config keys") \
            from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path!r} holds a {type(values).__name__}; expected a mapping of config keys")
    out: Dict[str, Any] = {}
    spelled: Dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name in out:  # local-epochs and local_epochs: one key spelled twice
            raise ConfigError(f"config file {path!r} gives the key {name!r} twice (as {spelled[name]!r} and "
                              f"{key!r}); expected each key once")
        out[name], spelled[name] = value, key
    return out
