"""Rule families of rsi. Each module is one family; `register.py` lists them all."""
