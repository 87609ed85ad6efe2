"""YAML in and out for specs and plans: numbers in any spelling, deterministic output.

PyYAML follows YAML 1.1, where `4.8e12` and `1e-6` are strings (1.1 wants a dot and a signed
exponent); people write them as numbers, so the loader here resolves them as floats. The dumper
writes lists of scalars on one line (expert ids read best that way) and records block-style.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    pass


_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                        |[-+]?\.(?:inf|Inf|INF)
                        |\.(?:nan|NaN|NAN))$""", re.X)
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """The parsed file, or `error` naming the file (missing, a folder, not YAML)."""
    if not path.exists():
        raise error(f"{path}: no such file")
    if not path.is_file():
        raise error(f"{path}: not a file")
    try:
        return yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506  (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file") from None


class _Dumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list) -> Any:
    flow = all(isinstance(x, (int, float, str)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(tuple, _represent_list)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=120, default_flow_style=False, allow_unicode=True)
