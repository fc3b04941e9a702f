"""YAML for clusterctl templates: values that must stay strings once clusterctl substitutes a variable in them (an
annotation's count, a port in an environment variable) are written double-quoted; text of several lines (a file's
content in bootstrap data) as a literal block, as people write it."""

from __future__ import annotations

from typing import Any

import yaml


class Quoted(str):
    """A value that must stay a string once clusterctl puts a number in it: written quoted."""


class Dumper(yaml.SafeDumper):
    """pyyaml's safe dumper, writing Quoted values double-quoted."""


Dumper.add_representer(Quoted, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", str(value), style='"'))
Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=Dumper, sort_keys=False, width=120)
