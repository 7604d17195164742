"""What an operator runs or opens, apart from the request path: the admin routes (dashboard,
metrics, journal, inspect), the `inspect`, `bill`, `journal` and `health` commands. These need the
whole application (its state, the protocols' pipeline); nothing on the request path imports them."""
