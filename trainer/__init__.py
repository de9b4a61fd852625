"""The default training package tfcluster ships to workers.

`python -m trainer.task` trains an image classifier with MultiWorkerMirroredStrategy (its flags:
`flags`; its model, precision and image counter: `model`; its callbacks: `callbacks`);
`python -m trainer.create_tfrecords` turns an image folder into TFRecord shards (written by
`records`, without TensorFlow; each image decoded by `images` as the served model decodes it);
`data` is the tf.data pipeline over them; `export` writes the model ready to serve.
Beside them: `lr` (the learning rate that follows the global batch, its warm-up and decay), `gpu`
(GPU utilisation sampled from nvidia-smi), `events` (the progress lines the launcher reads),
`input_watch` (which worker's input stopped), `tune` and `tune_hooks` (`invoke tune`).
The package imports nothing from tfcluster: only this folder is shipped to remote hosts.
"""
