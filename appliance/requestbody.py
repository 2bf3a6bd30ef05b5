"""The JSON body of an API request, refused with 400 JSON (never a 500) when it is not JSON, nests
deeper than MAX_DEPTH, or holds a lone surrogate in a string (JSON's "\ud800" escape decodes to one;
no UTF-8 text can hold it, so neither Redis nor the tokenizer could take the prompt)."""
import json

from flask import request

from appliance.schema import Invalid

MAX_DEPTH = 32   # far more than any request body needs


def read() -> dict:
    if not request.is_json:
        raise Invalid("the body must be a JSON object (Content-Type: application/json)")
    try:
        body = json.loads(request.get_data(cache=True))
    except RecursionError:   # nesting beyond Python's recursion limit
        raise Invalid(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:   # also bytes that are not UTF-8
        raise Invalid(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object (Content-Type: application/json)")
    check(body)
    return body


def check(body: dict) -> None:
    """Walk a request body without recursion (an API request's, or a batch line's): depth, and
    every string (keys too) encodable as UTF-8; Invalid otherwise."""
    todo = [(body, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise Invalid(f"the body nests deeper than {MAX_DEPTH} levels")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            for text in (key, item):
                if isinstance(text, str):
                    try:
                        text.encode()
                    except UnicodeEncodeError:
                        raise Invalid("strings must be valid Unicode (a lone surrogate such as \\ud800 is not)") \
                            from None
            if isinstance(item, dict | list):
                todo.append((item, depth + 1))
