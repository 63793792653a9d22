"""Quiet the messages of fairseq's dependencies that bury a command's one-line error
(installed on the command-line path only; a library user's warning filters and log levels are
never touched).

* hydra's deprecation notices about how fairseq calls it: nothing a user can act on;
* fairseq's wav2vec2_classification module calls ``logging.basicConfig(level=DEBUG)`` on import,
  which puts hydra's debug messages on stderr of every fairseq-generate run;
* faiss's loader reports at INFO level which CPU instruction sets it tried.
"""
import logging
import warnings

HYDRA_NOTICES = (r"\s*hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
                 r"\s*The version_base parameter is not specified",
                 r"\s*In '.*': Usage of deprecated keyword in package header",
                 r"\s*'.*' is validated against ConfigStore schema with the same name",
                 r"\s*The strict flag in the compose API is deprecated")


def quiet_dependency_noise() -> None:
    for pattern in HYDRA_NOTICES:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    logging.getLogger("hydra").setLevel(logging.INFO)
    logging.getLogger("faiss").setLevel(logging.WARNING)
