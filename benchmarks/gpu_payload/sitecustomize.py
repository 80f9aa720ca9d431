# the payload's site: its .pth files (setuptools' distutils shim) processed as a site-packages' are
import os
import site
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if _here in sys.path:
    site.addsitedir(_here)
