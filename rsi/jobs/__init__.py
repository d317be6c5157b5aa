"""Durable evaluation jobs (`rsi job`, docs/jobs.md): a build, a campaign round or a final run
detached under a budgeted profile, owned by its own cgroup, recorded in an SQLite database in the
store, resumable after its runner is killed, with its events in the build event format. A job must
never outlive its budget or its cgroup.

- `profile`: profiles (content-addressed TOML) and the budget ledger
- `db`: the jobs database (`<store>/jobs/jobs.db`)
- `contain`: the job's cgroup (or session), killing exactly its processes
- `events`: the job's event stream (`rsi.events/1`)
- `kinds`: what a job runs (`build`; families add more through `rsi.job_kinds`)
- `runner`: the detached process that runs one job
- `service`: submit, status, logs, cancel, resume, artifacts in process
- `cli`: `rsi job …`
"""
