"""The roles' filters, one module per role (``FILTERS``), each loaded by a short shim in
``roles/<role>/filter_plugins/``: the rules live here, in the package, where they are tested."""
