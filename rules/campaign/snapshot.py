"""Snapshots: a candidate's editable files, or an external project's whole tree, hashed into the
store as `{path: digest}` manifests. It must never follow a symlink or keep a file outside the
declared scope."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from rsi.digest import digest_value
from rsi.errors import DeclarationError, UsageError
from rules.campaign.model import Campaign, State, project_spec
from rules.campaign.paths import DEFAULT_EXCLUDE, in_scope, walk_files


def manifest_digest(files: Mapping[str, str], executable: list[str]) -> str:
    return str(
        digest_value({"files": dict(sorted(files.items())), "executable": sorted(executable)})
    )


def freeze_project(camp: Campaign, store) -> dict:
    """Hash and store the external project's tree: the baseline and protocol of this campaign."""
    b = camp.binding
    root = Path(b.attrs["root"])
    if not root.is_absolute():
        root = camp.ws.root / b.label.package / root
    root = root.resolve()
    if not root.is_dir():
        raise DeclarationError(
            f"the project folder {root} does not exist",
            file=b.file,
            target=str(b.label),
            field="root",
            hint="root is absolute or relative to the package folder",
        )
    exclude = DEFAULT_EXCLUDE + tuple(b.attrs["exclude"])
    found = walk_files(root, exclude, skip=(camp.ws.store_dir, camp.ws.out_dir))
    for pat in b.attrs["protocol"]:
        if pat not in found and not (pat.endswith("/") and any(r.startswith(pat) for r in found)):
            raise DeclarationError(
                f"protocol file {pat!r} is not in {root}",
                file=b.file,
                target=str(b.label),
                field="protocol",
            )
    for pat in b.attrs["editable"]:
        if not any(in_scope(r, [pat]) for r in found):
            raise DeclarationError(
                f"editable pattern {pat!r} matches no file in {root}",
                file=b.file,
                target=str(b.label),
                field="editable",
            )
    files, exe = {}, []
    for rel, path in sorted(found.items()):
        files[rel] = str(store.put_file(path))
        if os.access(path, os.X_OK):
            exe.append(rel)
    manifest = manifest_digest(files, exe)
    protocol = {rel: d for rel, d in files.items() if in_scope(rel, b.attrs["protocol"])}

    def error(message: str, field_name: str, hint: str | None = None) -> DeclarationError:
        return DeclarationError(
            message, file=b.file, target=str(b.label), field=field_name, hint=hint
        )

    return {
        "root": str(root),
        "files": files,
        "executable": exe,
        "manifest": manifest,
        "protocol": protocol,
        "n_files": len(files),
        "spec": project_spec(b.attrs, error),
    }


def task_candidate_files(camp: Campaign, src: Path) -> dict[str, Path]:
    """A catalog task's candidate folder: (some of) the editable files and nothing else."""
    found = walk_files(src)
    outside = sorted(r for r in found if r not in camp.scope)
    if outside:
        raise UsageError(
            f"--from {src}: {', '.join(outside)} lie outside the editable scope "
            f"({', '.join(camp.scope)})",
            hint="a candidate folder holds only (some of) the editable files",
        )
    return found


def snapshot_candidate(camp: Campaign, src: Path, state: State, store) -> dict:
    from rsi.digest import digest_file

    if not src.is_dir():
        raise UsageError(
            f"--from {src}: not a folder",
            hint="pass the folder holding the candidate's editable files",
        )
    if camp.kind == "task":
        take, ignored = task_candidate_files(camp, src), []
        base_files, base_exe = {}, []
    else:
        project = state.start["project"]
        scope = (project.get("spec") or {}).get("editable") or camp.scope
        exclude = DEFAULT_EXCLUDE + tuple(camp.binding.attrs["exclude"])
        found = walk_files(src, exclude, skip=(camp.ws.store_dir, camp.ws.out_dir))
        take = {r: p for r, p in found.items() if in_scope(r, scope)}
        base_files = {r: d for r, d in project["files"].items() if in_scope(r, scope)}
        base_exe = [r for r in project.get("executable", []) if r in base_files]
        ignored = sorted(
            r
            for r, p in found.items()
            if not in_scope(r, scope)
            and (
                r not in project["files"]
                or str(digest_file(p, store.function)) != project["files"][r]
            )
        )
    if not take:
        raise UsageError(
            f"--from {src}: no file of the editable scope ({', '.join(camp.scope)}) is there"
        )
    files, exe = dict(base_files), set(base_exe)
    for rel, path in sorted(take.items()):
        files[rel] = str(store.put_file(path))
        exe.discard(rel)
        if os.access(path, os.X_OK):
            exe.add(rel)
    executable = sorted(exe)
    return {
        "files": files,
        "executable": executable,
        "digest": manifest_digest(files, executable),
        "ignored_outside_scope": ignored,
    }
