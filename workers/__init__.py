"""Device-side DeployHub worker: claims hub jobs over HTTP and runs them.

Nothing in this package imports Django; a device needs only Celery, the broker
URL, the hub URL, its device token and its runtimes.
"""
