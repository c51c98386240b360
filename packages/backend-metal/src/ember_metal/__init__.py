"""ember-backend-metal: Apple GPUs for ember (MSL rendering everywhere; the Metal runtime on macOS)."""
__version__ = "0.1.0"
