"""The first module the forkserver of tests/preloaded.py imports: the process set up as the CLI sets up its
own before it imports the libraries (runtime.prepare), so that the server's imports print what a fresh run's
print (nothing: DeepSpeed's accelerator line at import is filtered out). The server's PYTHONPATH named this
folder for this module alone: here it is the session's again, and so is sys.path, which forked runs take."""

import os
import sys
from pathlib import Path

from bert_squad import runtime

sys.path.remove(str(Path(__file__).parent))
session = os.environ.pop("PYTHONPATH").partition(os.pathsep)[2]
if session:
    os.environ["PYTHONPATH"] = session
runtime.prepare()
SYS_PATH = list(sys.path)  # a fresh interpreter's, the working directory ('') first
