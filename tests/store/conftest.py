"""What the store's tests of object storage share: moto's S3 server with the bucket `lab`."""

import pytest
from helpers import moto_server, s3_client


@pytest.fixture(scope="module")
def port():
    """moto's S3 server on the loopback, the bucket `lab` made: its port."""
    with moto_server() as port:
        s3_client(port).create_bucket(Bucket="lab")
        yield port
