"""Every key of Trinity-RFT's ``Config``: the dataclass fields reachable from ``Config`` in its
``trinity/common/config.py``, read with ``ast`` (nothing of Trinity's is imported). A list item is written ``[]``,
a named entry of a dict section ``<name>``.

    python make_schema_keys.py /path/to/trinity/common/config.py > schema_keys.txt
"""

from __future__ import annotations

import ast
import re
import sys


def dataclass_fields(source: str) -> dict[str, list[tuple[str, str]]]:
    """Class name -> [(field, annotation as written)]."""
    classes = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = [(st.target.id, ast.unparse(st.annotation)) for st in node.body
                                  if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)]
    return classes


def keys(classes: dict[str, list[tuple[str, str]]], cls: str = "Config", prefix: str = "",
         seen: frozenset[str] = frozenset({"Config"})) -> list[str]:
    out = []
    for name, ann in classes[cls]:
        m = re.match(r"(Optional\[)?(List\[|Dict\[str, )?([A-Za-z_]+)", ann)
        base = m.group(3) if m else ann
        key = prefix + name
        if base in classes and base not in seen:
            sub = key + ("[]." if "List[" in ann else ".<name>." if "Dict[" in ann else ".")
            out += keys(classes, base, sub, seen | {base})
        else:
            out.append(key)
    return out


if __name__ == "__main__":
    print("\n".join(keys(dataclass_fields(open(sys.argv[1]).read()))))
