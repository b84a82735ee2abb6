"""Where a run's metrics and sample grids go besides its own files: TorchRL's loggers (``log.backend``).

    logger = RunLogger("wandb", run_dir / "logs", run_id, project="digits", hparams=config.to_dict())
    logger.scalars(row, "train", step)           # every number of ``row`` as ``train/<key>``
    logger.image("eval/samples", png, step)      # a sample grid PNG, as an image (wandb)
    logger.close()                               # flush; a later call opens the experiment again

A run that continues from a checkpoint passes ``resume_step`` (its iteration): the CSV backend's scalar files
(``logs/run/scalars/**.csv``, which TorchRL appends to) lose the rows a killed run logged after that step before
anything is logged, so every step appears once (all rows go when it is 0: the run starts over).

``auto``: TensorBoard when installed, else CSV; ``tensorboard``, ``csv`` or ``wandb`` (Weights & Biases, whose
run id is the run's, so a resumed run continues its wandb run; ``WANDB_MODE=offline`` keeps it on this machine).
The experiment is opened at the first log, so nothing is written by a trainer that never logs. Sample grids are
logged as images to wandb; the other backends keep them as the run directory's PNG files only.
"""

from __future__ import annotations

from pathlib import Path

# Imported with this module, not at a run's first log: importing torchrl's loggers keeps the frames of the stack that
# first imports it (the traceback of its compiled extension's failed load), which would hold that run's Trainer, and
# its model, alive for the rest of the process.
from torchrl.record.loggers import CSVLogger, TensorboardLogger

from vgrpo_lib.errors import UsageError
from vgrpo_lib.extras import missing_packages, require_extra
from vgrpo_lib.integrations.atomic import atomic_write_text

__all__ = ["LOG_BACKENDS", "RunLogger", "check_wandb_credentials", "drop_csv_steps_after", "make_logger", "resolve_backend"]

LOG_BACKENDS = ("auto", "tensorboard", "csv", "wandb")


def resolve_backend(backend: str) -> str:
    """The concrete backend of ``backend`` (``auto``: tensorboard when installed, else csv); a
    :class:`~vgrpo_lib.extras.MissingExtraError` naming the extra to install when the chosen one is missing."""
    if backend == "auto":
        return "csv" if missing_packages("tensorboard") else "tensorboard"
    if backend in ("tensorboard", "wandb"):
        require_extra(backend, f"log.backend={backend}")
    return backend


def check_wandb_credentials() -> None:
    """Refuse ``log.backend=wandb`` before a run writes anything when Weights & Biases cannot log: no API key (nor
    ``WANDB_MODE=offline``) or a malformed one; a :class:`~vgrpo_lib.errors.UsageError` of one line. Asks
    ``wandb.login(verify=False)``, which reads the key from ``WANDB_API_KEY`` or ``wandb login``'s file without a
    network call (and prompts for one on a terminal, as ``wandb.init`` would). The trainer calls it once, in its
    constructor, when ``resolve_backend`` says wandb."""
    import wandb

    try:
        wandb.login(verify=False)
    except wandb.errors.Error as error:
        raise UsageError(f"log.backend=wandb cannot log: {error} Or set WANDB_API_KEY, or WANDB_MODE=offline to "
                         f"keep the logs on this machine.") from None


def make_logger(backend: str, log_dir: Path, run_id: str, project: str | None = None):
    """TorchRL's logger for a concrete ``backend`` (see :func:`resolve_backend`) writing under ``log_dir``."""
    if backend == "wandb":
        from torchrl.record.loggers.wandb import WandbLogger

        return WandbLogger(exp_name="run", save_dir=str(log_dir), id=run_id, project=project, log_env_packages=False)
    if backend == "tensorboard":
        return TensorboardLogger(exp_name="run", log_dir=str(log_dir))
    return CSVLogger(exp_name="run", log_dir=str(log_dir))


def drop_csv_steps_after(log_dir: Path, step: int) -> None:
    """Rewrite each scalar file ``step,value`` of TorchRL's CSV logger under ``log_dir`` without the rows after
    ``step`` (every row when ``step`` is 0) and without a torn last line (atomically, only files that change)."""
    for path in sorted(Path(log_dir).glob("*/scalars/**/*.csv")):
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        steps = [_csv_step(line) for line in lines]
        kept = [line for line, logged in zip(lines, steps) if logged is not None and step > 0 and logged <= step]
        if kept != lines:
            atomic_write_text(path, "".join(kept))


def _csv_step(line: str) -> int | None:
    """The step of a ``step,value`` line; None for a torn or foreign line."""
    step, _, value = line.partition(",")
    return int(step) if step.isascii() and step.isdigit() and value.endswith("\n") else None


class RunLogger:
    """One run's TorchRL logger, opened at its first use (see the module doc).

    Args:
        backend: one of :data:`LOG_BACKENDS` (checked here: a missing package fails before training).
        log_dir: where the logger writes (the run directory's ``logs``).
        run_id: the run's id (wandb's run id).
        project: the wandb project.
        hparams: the run's config, recorded by wandb as the run's config.
        resume_step: the step the run continues from (its iteration): CSV scalars logged after it are dropped
            first (all of them when 0).
    """

    def __init__(self, backend: str, log_dir: Path, run_id: str, project: str | None = None,
                 hparams: dict | None = None, resume_step: int = 0):
        self.backend = resolve_backend(backend)
        self.log_dir, self.run_id, self.project, self.hparams = Path(log_dir), run_id, project, hparams
        self.resume_step = resume_step
        self._logger = None

    @property
    def logger(self):
        """The TorchRL logger (opened now if it is not yet)."""
        if self._logger is None:
            if self.backend == "csv":
                drop_csv_steps_after(self.log_dir, self.resume_step)
            self._logger = make_logger(self.backend, self.log_dir, self.run_id, self.project)
            if self.backend == "wandb" and self.hparams is not None:
                self._logger.log_hparams(self.hparams)
        return self._logger

    def scalars(self, row: dict, prefix: str, step: int) -> None:
        """Log every int / float of ``row`` as ``<prefix>/<key>`` at ``step`` (one record per call)."""
        numbers = {f"{prefix}/{k}": float(v) for k, v in row.items() if isinstance(v, (int, float))}
        self.logger.log_metrics(numbers, step=step)

    def image(self, name: str, png: Path, step: int) -> None:
        """Log the PNG file ``png`` as the image ``name`` at ``step`` (wandb; a no-op for the other backends)."""
        if self.backend == "wandb":
            import wandb

            self.logger.log_metrics({name: wandb.Image(str(png))}, step=step)

    def close(self) -> None:
        """Flush and close the logger (wandb: finish the run); the next log opens it again."""
        if self._logger is not None:
            self._logger.close()
            self._logger = None
