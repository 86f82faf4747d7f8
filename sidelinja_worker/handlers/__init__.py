"""Every job type this program runs. A new job type is a new module and one line below."""

from sidelinja_worker.handlers import noop
from sidelinja_worker.registry import Registry

REGISTRY = Registry([
    noop.JOB_TYPE,
])
