"""The DDP doctor's instruments, by area as its rules are (lessons/tools/doctor_rules.py): the recorder every
installer shares and the end (recorder.py), data (data.py), the process group and the model (group.py), files
(files.py). doctor_site/sitecustomize.py loads them into every rank; nothing here runs on import."""
