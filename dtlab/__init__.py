"""dtlab: learn distributed training by running it."""
from dtlab.i18n import ConfigError, DtlabError, get_language, set_language

__version__ = "0.1.0"

__all__ = ["ConfigError", "DtlabError", "get_language", "set_language", "__version__"]
