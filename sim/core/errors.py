"""Errors that the command line turns into one-line messages and exit code 2."""


class PipeSimError(Exception):
    """A user-facing error: bad config, bad data file, missing trace.

    The message is one line that names the file, the field and the allowed values.
    """


class ConfigError(PipeSimError):
    """A config file or override is invalid."""


class DataError(PipeSimError):
    """A data file (trace, profile table) is missing or malformed."""


class PluginError(PipeSimError):
    """A user plug-in (chunk policy, rebalancer) failed to load, broke a rule of the plug-in
    API, or raised during a run; the message names the plug-in and the rule."""


class DiskFull(PipeSimError):
    """A write found no room (no space left on the device, or a quota exceeded); the message
    names the path and the space left (sim/core/fsio.py disk_full)."""
