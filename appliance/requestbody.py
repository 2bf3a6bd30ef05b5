"""The JSON body of an API request, refused with 400 JSON (never a 500) when it is not JSON, nests
deeper than MAX_DEPTH, or holds a lone surrogate in a string (JSON's "\ud800" escape decodes to one;
no UTF-8 text can hold it, so neither Redis nor the tokenizer could take the prompt), and with 413
when it is over MAX_CONTENT_LENGTH, its length stated or not (chunked)."""
import json

from flask import request
from werkzeug.exceptions import RequestEntityTooLarge

from appliance.schema import Invalid

MAX_DEPTH = 32   # far more than any request body needs


def read() -> dict:
    if not request.is_json:
        raise Invalid("the body must be a JSON object (Content-Type: application/json)")
    try:
        body = json.loads(_data())
    except RecursionError:   # nesting beyond Python's recursion limit
        raise Invalid(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:   # also bytes that are not UTF-8
        raise Invalid(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object (Content-Type: application/json)")
    check(body)
    return body


def _data() -> bytes:
    """The body's bytes. Werkzeug refuses a stated length over the limit, but reads a chunked body
    only up to the limit and stops there, as if it ended; one more byte from the server's stream
    tells a body of exactly the limit from a longer one, which is refused as a stated one is."""
    data = request.get_data(cache=True)
    limit = request.max_content_length
    if (request.content_length is None and limit is not None and len(data) >= limit
            and request.environ.get("wsgi.input_terminated") and request.environ["wsgi.input"].read(1)):
        raise RequestEntityTooLarge()
    return data


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
