"""The ``miniverl`` command: a typer app, one thin command per library call.

Heavy imports (torch, transformers, peft, pyarrow) live inside command bodies so that
``miniverl --help`` stays fast and torch-free. Expected failures print one line and
exit 1; nothing here holds logic that a library function should own.
"""
