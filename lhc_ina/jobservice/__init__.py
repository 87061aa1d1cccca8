"""The job service a worker speaks to the controller: its protocol (``jobservice.proto`` and the stubs
generated from it), the client and the error type. It lives on the ground floor so that a worker installs
and runs without the controller's code; the controller serves it (``controller/service.py``)."""
