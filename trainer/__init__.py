"""The default training package tfcluster ships to workers.

`python -m trainer.task` trains an image classifier with MultiWorkerMirroredStrategy;
`python -m trainer.create_tfrecords` turns an image folder into TFRecord shards (written by
trainer/records.py, without TensorFlow); trainer/export.py writes the model ready to serve.
Beside them: `lr` (the learning rate that follows the global batch, and its warm-up), `gpu`
(GPU utilisation sampled from nvidia-smi), `events` (the progress lines the launcher reads).
The package imports nothing from tfcluster: only this folder is shipped to remote hosts.
"""
