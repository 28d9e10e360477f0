"""The engine side of a serving container: it runs in its own process.

``wire`` holds the messages between the server and a worker process, ``backend`` the
step-level interface every engine offers the worker, ``main`` the worker's loop.
"""
