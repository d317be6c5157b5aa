"""Rule families of rsi. Each module is one family; `register.py` lists them all. The engine never
imports this package; a family must never import another family's internals."""
