"""The default training package tfcluster ships to workers.

`python -m trainer.task` trains an image classifier with MultiWorkerMirroredStrategy;
`python -m trainer.create_tfrecords` turns an image folder into TFRecord shards (written by
trainer/records.py, without TensorFlow); trainer/export.py writes the model ready to serve.
"""
