'use strict';
// The page for people: uploads to the OpenAI-style endpoints (streamed as server-sent events) and live
// transcription over the /v1/audio/live WebSocket. No build step, no dependencies.

const $ = (id) => document.getElementById(id);
const KEY_STORE = 'asr.apiKey';
const upload = { file: null, audioUrl: null, segments: [], text: '', language: null, finished: false };

// --- settings -------------------------------------------------------------------------------------------

function apiKey() {
  return $('api-key').value.trim();
}

function authHeaders() {
  return apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
}

try {
  $('api-key').value = localStorage.getItem(KEY_STORE) || '';
} catch { /* storage may be off (private windows): the key then lasts for the page only */ }
$('api-key').addEventListener('input', () => {
  try { localStorage.setItem(KEY_STORE, apiKey()); } catch { /* see above */ }
});

async function modelId() {
  try {
    const response = await fetch('/v1/models', { headers: authHeaders() });
    if (response.ok) return (await response.json()).data?.[0]?.id || 'whisper-1';
  } catch { /* the transcription request will report what is wrong */ }
  return 'whisper-1';
}

function setStatus(element, text, kind = '') {
  element.textContent = text;
  element.dataset.kind = kind;
}

// Stats vary with the model and the assistant: name a few well-known figures, list all in the details.
const HEADLINE = ['audio_seconds', 'total_seconds', 'compute_seconds', 'model_forward_passes', 'model_passes', 'rtf'];

function figure(value) {
  return typeof value === 'number' && !Number.isInteger(value) ? String(Math.round(value * 1000) / 1000) : String(value);
}

function summary(stats) {
  return HEADLINE.filter((key) => key in (stats || {})).map((key) => `${key.replace(/_/g, ' ')} ${figure(stats[key])}`)
    .join(' · ');
}

function showStats(stats) {
  const list = $('stats');
  list.replaceChildren();
  for (const [key, value] of Object.entries(stats || {})) {
    if (value === null || typeof value === 'object') continue;
    list.append(Object.assign(document.createElement('dt'), { textContent: key.replace(/_/g, ' ') }),
      Object.assign(document.createElement('dd'), { textContent: figure(value) }));
  }
  $('stats-box').hidden = !list.childElementCount;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message || JSON.stringify(body);
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// --- upload -----------------------------------------------------------------------------------------------

function chooseFile(file) {
  if (!file) return;
  upload.file = file;
  $('file-name').textContent = `${file.name} (${(file.size / 1e6).toFixed(1)} MB)`;
  if (upload.audioUrl) URL.revokeObjectURL(upload.audioUrl);
  upload.audioUrl = URL.createObjectURL(file);
  $('player').src = upload.audioUrl;
  $('player').hidden = false;
  $('transcribe').disabled = false;
  setStatus($('status'), 'Ready: press Transcribe.');
}

$('file').addEventListener('change', (event) => chooseFile(event.target.files[0]));
const drop = $('drop');
drop.addEventListener('dragover', (event) => {
  event.preventDefault();
  drop.classList.add('over');
});
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', (event) => {
  event.preventDefault();
  drop.classList.remove('over');
  chooseFile(event.dataTransfer.files[0]);
});

function resetResults() {
  Object.assign(upload, { segments: [], text: '', language: null, finished: false });
  $('segments').replaceChildren();
  $('transcript').textContent = '';
  $('stats-box').hidden = true;
  for (const button of document.querySelectorAll('.download')) button.disabled = true;
}

async function transcribe() {
  const file = upload.file;
  if (!file) return;
  resetResults();
  $('transcribe').disabled = true;
  const task = $('task').value;
  try {
    const form = new FormData();
    form.append('file', file, file.name);
    form.append('model', await modelId());
    form.append('response_format', 'verbose_json');
    form.append('stream', 'true');
    if ($('language').value && task === 'transcribe') form.append('language', $('language').value);
    setStatus($('status'), `Uploading ${file.name}…`, 'busy');
    const path = task === 'translate' ? '/v1/audio/translations' : '/v1/audio/transcriptions';
    const response = await fetch(path, { method: 'POST', headers: authHeaders(), body: form });
    if (!response.ok) throw new Error(await errorMessage(response));
    setStatus($('status'), 'Transcribing…', 'busy');
    await readEvents(response, onUploadEvent);
    if (!upload.finished) throw new Error('the server ended the stream before the transcript was done');
  } catch (error) {
    setStatus($('status'), `Error: ${error.message}`, 'error');
  } finally {
    $('transcribe').disabled = false;
  }
}

$('transcribe').addEventListener('click', transcribe);

// Server-sent events arrive in arbitrary chunks: keep the unfinished tail until its blank line comes.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, '');
      const data = block.split(/\r?\n/).filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).replace(/^ /, '')).join('\n');
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
    setStatus($('status'), `Done: ${language}${summary(event.stats)}`, 'done');
    showStats(event.stats);
  } else if (event.type === 'error') {
    throw new Error(event.error?.message || 'the server failed');
  }
}

function addSegment(segment) {
  const index = upload.segments.push(segment) - 1;
  const item = document.createElement('li');
  item.className = 'segment';
  item.tabIndex = 0;
  item.dataset.index = index;
  const time = Object.assign(document.createElement('span'), { className: 'time' });
  time.textContent = segment.start == null ? '' : stamp(segment.start, '.', false);
  item.append(time, Object.assign(document.createElement('span'), { textContent: segment.text.trim() }));
  $('segments').append(item);
  upload.text = upload.segments.map((s) => s.text).join('').trim();
  $('transcript').textContent = upload.text;
  for (const button of document.querySelectorAll('.download')) button.disabled = false;
}

// --- playback ---------------------------------------------------------------------------------------------

function seekTo(item) {
  const segment = upload.segments[Number(item.dataset.index)];
  if (!segment || segment.start == null || !upload.audioUrl) return;
  $('player').currentTime = segment.start;
  $('player').play().catch(() => { /* autoplay refused: the position is set anyway */ });
}

$('segments').addEventListener('click', (event) => {
  const item = event.target.closest('.segment');
  if (item) seekTo(item);
});
$('segments').addEventListener('keydown', (event) => {
  const item = event.target.closest('.segment');
  if (item && (event.key === 'Enter' || event.key === ' ')) {
    event.preventDefault();
    seekTo(item);
  }
});
$('player').addEventListener('timeupdate', () => {
  const now = $('player').currentTime;
  for (const item of $('segments').children) {
    const segment = upload.segments[Number(item.dataset.index)];
    const current = segment.start != null && segment.start <= now && now < segment.end;
    if (current && !item.classList.contains('current')) item.scrollIntoView({ block: 'nearest' });
    item.classList.toggle('current', current);
  }
});

// --- downloads --------------------------------------------------------------------------------------------

function stamp(seconds, separator, hours) {
  const ms = Math.max(0, Math.round(seconds * 1000));
  const pad = (n, width = 2) => String(n).padStart(width, '0');
  const h = Math.floor(ms / 3600000);
  const head = hours || h ? `${pad(h)}:` : '';
  return `${head}${pad(Math.floor(ms / 60000) % 60)}:${pad(Math.floor(ms / 1000) % 60)}${separator}${pad(ms % 1000, 3)}`;
}

function cues(hours, separator) {
  // "-->" inside a cue's text would end its timing line early, as openai-whisper's writers know.
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
  const link = Object.assign(document.createElement('a'), { href: url, download: `${baseName()}.${format}` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000); // some browsers read the URL after click() returns
}

function baseName() {
  return (upload.file?.name || 'transcript').replace(/\.[^.]*$/, '') || 'transcript';
}

for (const button of document.querySelectorAll('.download')) {
  button.addEventListener('click', () => download(button.dataset.format));
}

// --- live -------------------------------------------------------------------------------------------------

const live = { socket: null, stream: null, context: null, node: null, stopping: false, done: false };

// Batches the render quantum's 128 samples into ~0.1 s frames, so the socket carries few messages.
const WORKLET = `class Capture extends AudioWorkletProcessor {
  constructor() { super(); this.buffer = new Float32Array(Math.round(sampleRate / 10)); this.used = 0; }
  process(inputs) {
    const channel = inputs[0][0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      this.buffer[this.used++] = channel[i];
      if (this.used === this.buffer.length) { this.port.postMessage(this.buffer.slice()); this.used = 0; }
    }
    return true;
  }
}
registerProcessor('capture', Capture);`;

function pcm16(samples) {
  const view = new DataView(new ArrayBuffer(samples.length * 2));
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(i * 2, s < 0 ? s * 0x8000 : s * 0x7fff, true);
  }
  return view.buffer;
}

function sendAudio(samples) {
  if (live.socket?.readyState === WebSocket.OPEN && !live.stopping) live.socket.send(pcm16(samples));
}

// 16 kHz saves the server a resampling; browsers that cannot connect the microphone at that rate get their own.
async function openContext(stream) {
  try {
    const context = new AudioContext({ sampleRate: 16000 });
    try {
      return [context, context.createMediaStreamSource(stream)];
    } catch {
      await context.close();
    }
  } catch { /* the rate is not supported here */ }
  const context = new AudioContext();
  return [context, context.createMediaStreamSource(stream)];
}

async function capture(context, source) {
  const silent = context.createGain();
  silent.gain.value = 0; // nodes only run when connected towards the speakers; this keeps them quiet
  silent.connect(context.destination);
  if (context.audioWorklet) {
    try {
      const url = URL.createObjectURL(new Blob([WORKLET], { type: 'application/javascript' }));
      await context.audioWorklet.addModule(url);
      URL.revokeObjectURL(url);
      const node = new AudioWorkletNode(context, 'capture');
      node.port.onmessage = (event) => sendAudio(event.data);
      source.connect(node).connect(silent);
      return node;
    } catch { /* fall back below */ }
  }
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
  if (event.type === 'ready') {
    setStatus($('live-status'), `Listening (${event.model}, ${live.context?.sampleRate} Hz)… speak now.`, 'busy');
  } else if (event.type === 'segment') {
    $('live').append(document.createTextNode(event.text));
  } else if (event.type === 'hypothesis') {
    $('live-pending').textContent = event.text;
  } else if (event.type === 'done') {
    live.done = true;
    $('live-pending').textContent = '';
    setStatus($('live-status'), `Done: ${summary(event.stats)}`, 'done');
  } else if (event.type === 'error') {
    live.done = true;
    setStatus($('live-status'), `Error: ${event.error?.message || 'the server failed'}`, 'error');
  }
}

function setRecording(recording, label) {
  $('record').textContent = label;
  $('record').setAttribute('aria-pressed', String(recording));
}

async function startRecording() {
  $('record').disabled = true;
  Object.assign(live, { stopping: false, done: false });
  $('live').textContent = '';
  $('live-pending').textContent = '';
  try {
    setStatus($('live-status'), 'Asking for the microphone…', 'busy');
    live.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    let source;
    [live.context, source] = await openContext(live.stream);
    const socket = new WebSocket(liveUrl(live.context.sampleRate));
    live.socket = socket;
    socket.onmessage = onLiveMessage;
    socket.onclose = () => {
      releaseMicrophone();
      if (!live.done) setStatus($('live-status'), 'Error: the connection closed before the end.', 'error');
      live.socket = null;
      setRecording(false, 'Record');
      $('record').disabled = false;
    };
    await new Promise((resolve, reject) => {
      socket.addEventListener('open', resolve, { once: true });
      socket.addEventListener('error', () => reject(new Error('could not connect to the server')), { once: true });
    });
    live.node = await capture(live.context, source);
    setRecording(true, 'Stop');
  } catch (error) {
    live.done = true; // the error below is the whole story
    releaseMicrophone();
    live.socket?.close();
    setStatus($('live-status'), `Error: ${error.message}`, 'error');
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
  setStatus($('live-status'), 'Finishing the last words…', 'busy');
}

$('record').addEventListener('click', () => (live.socket ? stopRecording() : startRecording()));
