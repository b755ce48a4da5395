"""Label sources: which files to pack and the label of each (folders, lists, manifests, sidecars).

Every source ends in one :class:`LabelPlan`: the entries to read and pack, and the per-entry
problems (a listed file that is missing, a duplicate, an unparseable line, an unknown class)
that are reported in ``errors.jsonl`` and never replaced by a default label.  A label source
that cannot be used at all raises :class:`LabelSourceError`.

One module per source: :mod:`.dirname` (class folders, ``--label-depth``), :mod:`.listfile`
(PaddleOCR / PaddleClas lists), :mod:`.im2rec` (``.lst``), :mod:`.jsonl` and :mod:`.csvfile`
(manifests), :mod:`.sidecar`; :mod:`.classmap` (``--class-map``); :mod:`.detect` picks the
parser of a label file; :mod:`.plan` resolves ``--labels`` into the plan.
"""

from __future__ import annotations

from packer.errors import LabelSourceError
from packer.labels.classmap import ClassMap, class_names, load_class_map, map_label
from packer.labels.common import (
    KEYWORDS,
    UNKNOWN_CLASS,
    Listed,
    Parsed,
    find_label_file,
    loads_label,
    parse_label_text,
)
from packer.labels.csvfile import csv_rows_arrow, csv_rows_python, parse_csv
from packer.labels.detect import detect_kind, read_label_file
from packer.labels.dirname import dirname_labels
from packer.labels.im2rec import parse_lst_lines
from packer.labels.jsonl import parse_jsonl_lines
from packer.labels.listfile import parse_list_lines, split_list_line
from packer.labels.plan import LabelPlan, check_specs, from_label_files, plan_labels
from packer.labels.sidecar import sidecar_labels
from packer.records import Entry

__all__ = [
    "KEYWORDS",
    "UNKNOWN_CLASS",
    "ClassMap",
    "Entry",
    "LabelPlan",
    "LabelSourceError",
    "Listed",
    "Parsed",
    "check_specs",
    "class_names",
    "csv_rows_arrow",
    "csv_rows_python",
    "detect_kind",
    "dirname_labels",
    "find_label_file",
    "from_label_files",
    "load_class_map",
    "loads_label",
    "map_label",
    "parse_csv",
    "parse_jsonl_lines",
    "parse_label_text",
    "parse_list_lines",
    "parse_lst_lines",
    "plan_labels",
    "read_label_file",
    "sidecar_labels",
    "split_list_line",
]
