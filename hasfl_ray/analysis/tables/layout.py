"""What tables and figures share: the paper's names, the protocol line, TeX escaping, markdown and booktabs grids."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence


#: The paper's names for the algorithms (tables and figures; CSV keeps the command-line names).
DISPLAY_NAMES = {"hasfl": "HAS-FL", "hasfl (coverage off)": "HAS-FL, coverage off", "heterofl": "HeteroFL",
                 "fjord": "FjORD", "uniform": "Uniform", "random-budget": "Random-budget", "fedavg": "FedAvg",
                 "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fedrolex": "FedRolex",
                 "fiarse": "FIARSE", "fluid": "FLuID", "depthfl": "DepthFL", "scalefl": "ScaleFL", "fedgmr": "FedGMR"}
DATASET_NAMES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "emnist": "EMNIST", "shakespeare": "Shakespeare",
                 "digits": "Digits",
                 "synthetic": "Synthetic"}


def display_name(name: str) -> str:
    base, opening, rest = name.partition(" (")
    if name not in DISPLAY_NAMES and opening and base in DISPLAY_NAMES:  # "hasfl (fedbuff)": HAS-FL (fedbuff)
        return DISPLAY_NAMES[base] + opening + rest
    return DISPLAY_NAMES.get(name, DATASET_NAMES.get(name, name))


def protocol_line(config: Mapping[str, Any]) -> str:
    """The protocol of a run in a few symbols: N clients, per round, T rounds, K local epochs, Dirichlet alpha (an
    asynchronous run: C clients in flight and T server updates)."""
    if config.get("mode") == "async":
        line = (f"N={config.get('clients')}, C={config.get('concurrency')} in flight, "
                f"T={config.get('rounds')} server updates, K={config.get('local_epochs')}")
    else:
        line = (f"N={config.get('clients')}, {config.get('clients_per_round')}/round, T={config.get('rounds')}, "
                f"K={config.get('local_epochs')}")
    if config.get("dataset") not in ("shakespeare",):
        line += f", α={config.get('alpha')}"
    return line


PLUS_MINUS = {False: "±", True: r"$\pm$"}


def spread(mean: float, std: float, n: int, tex: bool = False) -> str:
    """A cell over seeds: ``mean ± std`` (one decimal), or the mean alone for a single seed, whose spread was not
    measured (never "± 0.0", which reads as a measured zero)."""
    if n < 2:
        return f"{mean:.1f}"
    return f"{mean:.1f} {PLUS_MINUS[tex]} {std:.1f}"


def over_seeds(counts: Sequence[int], tex: bool = False) -> str:
    """What a table's cells are: "mean ± std over seeds", or, where every row has one seed, "one seed: no spread"."""
    if counts and max(counts) < 2:
        return "one seed: no spread"
    return f"mean {PLUS_MINUS[tex]} std over seeds" + (" (one-seed rows: the value alone)"
                                                       if counts and min(counts) < 2 else "")


def _markdown_grid(header: Sequence[str], body: Sequence[Sequence[str]]) -> List[str]:
    """The lines of a markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(cells) + " |" for cells in body]


def _latex_grid(rows: Sequence[Dict[str, Any]], body: Sequence[Sequence[str]], caption: str, align: str,
                header: str) -> str:
    """A booktabs table: each row's dataset named on its first row, a rule between datasets, then ``body``'s
    cells (TeX already)."""
    lines = [r"\begin{table}[!htbp]", r"\centering",
             rf"\caption{{{_tex(caption)} ({over_seeds([len(row.get('seeds') or ()) for row in rows], True)})}}",
             r"\footnotesize", rf"\begin{{tabular}}{{{align}}}", r"\toprule", header + r" \\", r"\midrule"]
    previous = None
    for row, cells in zip(rows, body):
        if previous is not None and row["dataset"] != previous:
            lines.append(r"\midrule")
        dataset = _tex(display_name(row["dataset"])) if row["dataset"] != previous else ""
        previous = row["dataset"]
        lines.append(" & ".join([dataset] + list(cells)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


#: TeX's special characters in text, each as it prints itself (one pass: a replacement is never replaced again).
TEX_ESCAPES = str.maketrans({"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "$": r"\$",
                             "{": r"\{", "}": r"\}", "^": r"\textasciicircum{}", "~": r"\textasciitilde{}"})


def _tex(text: str) -> str:
    """``text`` (a run's or variant's name, a caption) as TeX text: every special character printed as itself."""
    return text.translate(TEX_ESCAPES)
