"""Sessions and turns over HTTP: how an application feeds conversations to the pipeline."""
