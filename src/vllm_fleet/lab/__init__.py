"""Controller-side tooling that builds the lab: image, wheelhouses, model mirror, secrets."""
