"""rigkit weights copier: runs inside a short-lived helper container on the rig, or on the rig
itself (check, as the deploy's read-only fact; manifest, send, receive and verify of a relay where
the rig's shell reaches the volume's folder, rigkit/weights/relay.py). One module per verb (check,
local_copy, verify, send, receive; state and proofs are shared, main reads the command line); it
travels as one file, assembled by rigkit/weights/copier.py, which `python3 -c` runs.

    python3 -c "<the assembled copier>" check|copy|verify [SRC DST [ROOT]]
    python3 -c "<the assembled copier>" check-each NAME SRC DST ROOT [NAME SRC DST ROOT ...]
    python3 -c "<the assembled copier>" manifest|send VOLUME     (on the rig a model's weights come from)
    python3 -c "<the assembled copier>" receive VOLUME [CHUNK_BYTES]  (on the rig that takes them; see send())

SRC is the model folder (default /src; mounted read-only: the source is never written);
DST the Docker volume (default /dst); ROOT the folder symlinks may point into (default
SRC). In a Hugging Face cache, models--ORG--NAME/snapshots/<revision>/ holds only symlinks
into ../../blobs/: ROOT is then models--ORG--NAME, and the content behind each link is
copied under the link's name. A link that dangles or leaves ROOT is an error, as is a
source that is missing, empty or cannot be listed: the volume is never marked complete
with files missing. Standard library only: the helper image is any image with python3
(by default the model's own serving image, which the rig has).

Source integrity, proven in the same read that copies (class Proof): in a Hugging Face cache
the file behind each link is ROOT/blobs/<name>, and <name> is the hub's own hash of it: 64 hex
digits are an LFS file's SHA-256 ("hub-sha256"), 40 a small file's git blob hash, sha1(b"blob
<size>\0" + content) ("git-blob-sha1"). A *.safetensors file (any source) must have a header
whose tensors tile the rest of the file exactly ("safetensors-header"). A file no check applies
to has only its SHA-256 ("copied-sha256"). A file that fails is not copied, and the copy ends
without a manifest or a marker, naming each such file with what was expected and what was found.

State in the volume, under DST/.rigkit/:
  progress.jsonl  one line per file copied: path, size, mtime_ns, sha256, proof (the checks it
                  passed), hub (its blob name, if any); on resume each listed file is re-read in
                  the volume and proven again before it is trusted
  manifest.json   every file, as in progress.jsonl; written when all files are in
  complete        the completion marker, written last; removed first by every copy
  writer.lock     flock'd by receive and verify while they run: one writer at a time
  chunks.jsonl    receive: each chunk fsynced, then journaled here (resume point)
  last-copy.json  receive: what the last complete copy read and wrote

check   compare the source's paths, sizes and mtimes with the manifest (reads no file contents)
copy    copy what is missing or different, resuming an interrupted copy, then write manifest and marker
verify  re-read every file in the volume: its SHA-256 against the manifest, and its proofs again (the
        hub name the manifest records, the safetensors header); remove files that fail and the marker

The last line printed is a JSON report. Exit codes: 0 ok, 1 corrupt (verify), 3 no space, 4 a source
file fails its integrity check (copy), 2 other errors. RIGKIT_WEIGHTS_PROOFS=off in the environment
turns the source checks off (bench/weights_copy.py measures their cost so; rigkit never sets it).
"""
