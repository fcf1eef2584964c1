'use strict';
// The page for people: uploads to the OpenAI-style endpoints (answered as server-sent events) and live
// transcription over the /v1/audio/live WebSocket. No build step, no dependencies.

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'asr.apiKey';
const upload = { file: null, audioUrl: null, segments: [], text: '', language: null, finished: false };

const apiKey = () => $('api-key').value.trim();
const authHeaders = () => (apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {});

try {
  $('api-key').value = localStorage.getItem(KEY_STORE) || '';
} catch { /* storage may be off (private windows): the key then lasts for the page only */ }
$('api-key').addEventListener('input', () => {
  try { localStorage.setItem(KEY_STORE, apiKey()); } catch { /* as above */ }
});

async function modelId() {
  try {
    const response = await fetch('/v1/models', { headers: authHeaders() });
    if (response.ok) return (await response.json()).data?.[0]?.id || 'whisper-1';
  } catch { /* the transcription request will report what is wrong */ }
  return 'whisper-1';
}

function setStatus(id, text, kind = '') {
  $(id).textContent = text;
  $(id).dataset.kind = kind;
}

// The stats differ between uploads, live streams and assistants: headline the well-known figures present.
const HEADLINE = ['audio_seconds', 'total_seconds', 'compute_seconds', 'model_forward_passes', 'model_passes', 'rtf'];
const figure = (v) => (typeof v === 'number' && !Number.isInteger(v) ? String(Math.round(v * 1000) / 1000) : String(v));
const label = (key) => key.replace(/_/g, ' ');

function summary(stats = {}) {
  return HEADLINE.filter((key) => key in stats).map((key) => `${label(key)} ${figure(stats[key])}`).join(' · ');
}

function showStats(stats = {}) {
  const list = $('stats');
  list.replaceChildren();
  for (const [key, value] of Object.entries(stats)) {
    if (value === null || typeof value === 'object') continue;
    list.append(Object.assign(document.createElement('dt'), { textContent: label(key) }),
      Object.assign(document.createElement('dd'), { textContent: figure(value) }));
  }
  $('stats-box').hidden = !list.childElementCount;
}

async function errorMessage(response) {
  const body = await response.json().catch(() => null);
  return body?.error?.message || `${response.status} ${response.statusText}`;
}

// Upload ------------------------------------------------------------------------------------------------

function chooseFile(file) {
  if (!file) return;
  upload.file = file;
  $('file-name').textContent = `${file.name} (${(file.size / 1e6).toFixed(1)} MB)`;
  if (upload.audioUrl) URL.revokeObjectURL(upload.audioUrl);
  upload.audioUrl = URL.createObjectURL(file);
  Object.assign($('player'), { src: upload.audioUrl, hidden: false });
  $('transcribe').disabled = false;
  setStatus('status', 'Ready: press Transcribe.');
}

$('file').addEventListener('change', (event) => chooseFile(event.target.files[0]));
for (const [name, over] of [['dragenter', true], ['dragover', true], ['dragleave', false], ['drop', false]]) {
  $('drop').addEventListener(name, (event) => {
    event.preventDefault(); // without it the browser opens the dropped file itself
    $('drop').classList.toggle('over', over);
    if (name === 'drop') chooseFile(event.dataTransfer.files[0]);
  });
}

function resetResults() {
  Object.assign(upload, { segments: [], text: '', language: null, finished: false });
  $('segments').replaceChildren();
  $('transcript').textContent = '';
  $('stats-box').hidden = true;
  document.querySelectorAll('.download').forEach((button) => { button.disabled = true; });
}

async function transcribe() {
  const { file } = upload;
  const task = $('task').value;
  resetResults();
  $('transcribe').disabled = true;
  try {
    const form = new FormData();
    form.append('file', file, file.name);
    form.append('model', await modelId());
    form.append('response_format', 'verbose_json');
    form.append('stream', 'true');
    if ($('language').value && task === 'transcribe') form.append('language', $('language').value);
    setStatus('status', `Uploading ${file.name}…`, 'busy');
    const path = task === 'translate' ? '/v1/audio/translations' : '/v1/audio/transcriptions';
    const response = await fetch(path, { method: 'POST', headers: authHeaders(), body: form });
    if (!response.ok) throw new Error(await errorMessage(response));
    setStatus('status', 'Transcribing…', 'busy');
    await readEvents(response, onUploadEvent);
    if (!upload.finished) throw new Error('the server ended the stream before the transcript was done');
  } catch (error) {
    setStatus('status', `Error: ${error.message}`, 'error');
  } finally {
    $('transcribe').disabled = false;
  }
}

$('transcribe').addEventListener('click', transcribe);

// Server-sent events arrive in arbitrary chunks: the unfinished tail waits for its blank line.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    let match;
    while ((match = /\r?\n\r?\n/.exec(buffer))) {
      const data = buffer.slice(0, match.index).split(/\r?\n/).filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).replace(/^ /, '')).join('\n');
      buffer = buffer.slice(match.index + match[0].length);
      if (data && data !== '[DONE]') onEvent(JSON.parse(data));
    }
    if (done) return;
  }
}

function onUploadEvent(event) {
  if (event.type === 'transcript.text.delta') {
    addSegment(event.segment || { start: null, end: null, text: event.delta });
  } else if (event.type === 'transcript.text.done') {
    Object.assign(upload, { text: event.text, language: event.language, finished: true });
    $('transcript').textContent = event.text;
    const language = event.language ? `language ${event.language} · ` : '';
    setStatus('status', `Done: ${language}${summary(event.stats)}`, 'done');
    showStats(event.stats);
  } else if (event.type === 'error') {
    throw new Error(event.error?.message || 'the server failed');
  }
}

function addSegment(segment) {
  const item = Object.assign(document.createElement('li'), { className: 'segment', tabIndex: 0 });
  item.dataset.index = upload.segments.push(segment) - 1;
  const time = segment.start == null ? '' : stamp(segment.start, '.', false);
  item.append(Object.assign(document.createElement('span'), { className: 'time', textContent: time }),
    Object.assign(document.createElement('span'), { textContent: segment.text.trim() }));
  $('segments').append(item);
  upload.text = upload.segments.map((s) => s.text).join('').trim();
  $('transcript').textContent = upload.text;
  document.querySelectorAll('.download').forEach((button) => { button.disabled = false; });
}

// Playback: the segment under the play head is highlighted; a click (or Enter) on one plays from its start.

function seekTo(item, event) {
  const segment = item && upload.segments[Number(item.dataset.index)];
  if (!segment || segment.start == null || (event.key && event.key !== 'Enter' && event.key !== ' ')) return;
  event.preventDefault();
  $('player').currentTime = segment.start;
  $('player').play().catch(() => { /* playback refused: the position is set anyway */ });
}

for (const name of ['click', 'keydown']) {
  $('segments').addEventListener(name, (event) => seekTo(event.target.closest('.segment'), event));
}
$('player').addEventListener('timeupdate', () => {
  const now = $('player').currentTime;
  for (const item of $('segments').children) {
    const { start, end } = upload.segments[Number(item.dataset.index)];
    const current = start != null && start <= now && now < end;
    if (current && !item.classList.contains('current')) item.scrollIntoView({ block: 'nearest' });
    item.classList.toggle('current', current);
  }
});

// Downloads, made here from the streamed segments ---------------------------------------------------------

function stamp(seconds, separator, hours) {
  const ms = Math.max(0, Math.round(seconds * 1000));
  const pad = (n, width = 2) => String(n).padStart(width, '0');
  const h = Math.floor(ms / 3600000);
  const minutes = `${pad(Math.floor(ms / 60000) % 60)}:${pad(Math.floor(ms / 1000) % 60)}`;
  return `${hours || h ? `${pad(h)}:` : ''}${minutes}${separator}${pad(ms % 1000, 3)}`;
}

function cues(hours, separator) {
  // "-->" inside a cue's text would end its timing line early (openai-whisper's writers replace it too).
  return upload.segments.map((s) => `${stamp(s.start, separator, hours)} --> ${stamp(s.end, separator, hours)}\n`
    + `${s.text.trim().replace(/-->/g, '->')}\n\n`);
}

const FORMATS = {
  txt: () => ['text/plain', upload.segments.map((s) => s.text.trim()).join('\n') + '\n'],
  srt: () => ['application/x-subrip', cues(true, ',').map((cue, i) => `${i + 1}\n${cue}`).join('')],
  vtt: () => ['text/vtt', `WEBVTT\n\n${cues(false, '.').join('')}`],
  json: () => ['application/json', JSON.stringify(
    { text: upload.text, language: upload.language, segments: upload.segments }, null, 2)],
};

function download(format) {
  const [type, body] = FORMATS[format]();
  const url = URL.createObjectURL(new Blob([body], { type: `${type};charset=utf-8` }));
  const name = (upload.file?.name || '').replace(/\.[^.]*$/, '') || 'transcript';
  const link = Object.assign(document.createElement('a'), { href: url, download: `${name}.${format}` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000); // some browsers read the URL after click() returns
}

document.querySelectorAll('.download').forEach((button) => {
  button.addEventListener('click', () => download(button.dataset.format));
});

// Live ------------------------------------------------------------------------------------------------

const live = { socket: null, stream: null, context: null, node: null, stopping: false, done: false };

// Batches the render quantum's 128 samples into ~0.1 s frames, so the socket carries few messages.
const WORKLET = `class Capture extends AudioWorkletProcessor {
  constructor() { super(); this.buffer = new Float32Array(Math.round(sampleRate / 10)); this.used = 0; }
  process(inputs) {
    const channel = inputs[0][0] || [];
    for (let i = 0; i < channel.length; i++) {
      this.buffer[this.used++] = channel[i];
      if (this.used === this.buffer.length) { this.port.postMessage(this.buffer.slice()); this.used = 0; }
    }
    return true;
  }
}
registerProcessor('capture', Capture);`;

function sendAudio(samples) {
  if (live.socket?.readyState !== WebSocket.OPEN || live.stopping) return;
  const view = new DataView(new ArrayBuffer(samples.length * 2)); // s16le, whatever this machine's order
  samples.forEach((x, i) => view.setInt16(i * 2, x < 0 ? Math.max(x, -1) * 0x8000 : Math.min(x, 1) * 0x7fff, true));
  live.socket.send(view.buffer);
}

// 16 kHz spares the server a resampling; a browser that cannot join the microphone at that rate uses its own.
async function openContext(stream) {
  let context;
  try {
    context = new AudioContext({ sampleRate: 16000 });
    return [context, context.createMediaStreamSource(stream)];
  } catch {
    await context?.close();
  }
  context = new AudioContext();
  return [context, context.createMediaStreamSource(stream)];
}

async function capture(context, source) {
  const silent = context.createGain();
  silent.gain.value = 0; // nodes run only when connected towards the speakers; this keeps them quiet
  silent.connect(context.destination);
  try {
    const url = URL.createObjectURL(new Blob([WORKLET], { type: 'application/javascript' }));
    await context.audioWorklet.addModule(url);
    URL.revokeObjectURL(url);
    const node = new AudioWorkletNode(context, 'capture');
    node.port.onmessage = (event) => sendAudio(event.data);
    source.connect(node).connect(silent);
    return node;
  } catch { /* no AudioWorklet (an older browser, or a page not served over https or localhost) */ }
  const node = context.createScriptProcessor(4096, 1, 1);
  node.onaudioprocess = (event) => sendAudio(event.inputBuffer.getChannelData(0));
  source.connect(node).connect(silent);
  return node;
}

function liveUrl(rate) {
  const query = new URLSearchParams({ sample_rate: String(rate), vad: 'true' });
  if ($('language').value) query.set('language', $('language').value);
  if ($('task').value === 'translate') query.set('task', 'translate');
  if (apiKey()) query.set('api_key', apiKey());
  return `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/v1/audio/live?${query}`;
}

function releaseMicrophone() {
  live.node?.disconnect();
  live.stream?.getTracks().forEach((track) => track.stop());
  live.context?.close().catch(() => {});
  Object.assign(live, { node: null, stream: null, context: null });
}

function onLiveMessage(message) {
  const event = JSON.parse(message.data);
  if (event.type === 'segment') {
    $('live').append(event.text); // committed: it stays
  } else if (event.type === 'hypothesis') {
    $('live-pending').textContent = event.text; // tentative: the next update replaces it
  } else if (event.type === 'done') {
    live.done = true;
    $('live-pending').textContent = '';
    setStatus('live-status', `Done: ${summary(event.stats)}`, 'done');
  } else if (event.type === 'error') {
    live.done = true;
    setStatus('live-status', `Error: ${event.error?.message || 'the server failed'}`, 'error');
  }
}

function setRecording(recording, text) {
  $('record').textContent = text;
  $('record').setAttribute('aria-pressed', String(recording));
}

async function startRecording() {
  $('record').disabled = true;
  Object.assign(live, { stopping: false, done: false });
  $('live').textContent = '';
  $('live-pending').textContent = '';
  try {
    setStatus('live-status', 'Asking for the microphone…', 'busy');
    live.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    let source;
    [live.context, source] = await openContext(live.stream);
    const socket = new WebSocket(liveUrl(live.context.sampleRate));
    live.socket = socket;
    socket.onmessage = onLiveMessage;
    socket.onclose = () => {
      releaseMicrophone();
      if (!live.done) setStatus('live-status', 'Error: the connection closed before the end.', 'error');
      live.socket = null;
      setRecording(false, 'Record');
      $('record').disabled = false;
    };
    // The server answers `ready` or `error` first: capture only once it listens, so nothing is lost.
    await new Promise((resolve, reject) => {
      socket.addEventListener('message', (m) => JSON.parse(m.data).type === 'ready' && resolve());
      socket.addEventListener('close', () => reject(new Error('could not connect to the server')));
    });
    live.node = await capture(live.context, source);
    if (live.socket !== socket) throw new Error('the connection closed'); // while the capture was being set up
    setStatus('live-status', `Listening (${live.context.sampleRate} Hz): speak now.`, 'busy');
    setRecording(true, 'Stop');
  } catch (error) {
    if (!live.done) setStatus('live-status', `Error: ${error.message}`, 'error');
    live.done = true; // the message above is the whole story
    releaseMicrophone();
    live.socket?.close();
    setRecording(false, 'Record');
  } finally {
    $('record').disabled = false;
  }
}

function stopRecording() {
  live.stopping = true;
  live.socket.send(JSON.stringify({ type: 'stop' }));
  releaseMicrophone();
  $('record').disabled = true; // until the server's `done` and close
  setRecording(false, 'Finishing…');
  setStatus('live-status', 'Finishing the last words…', 'busy');
}

$('record').addEventListener('click', () => (live.socket ? stopRecording() : startRecording()));
