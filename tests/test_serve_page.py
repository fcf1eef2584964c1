"""The page at `/` in a real headless Chromium: an upload streamed segment by segment, and live microphone
transcription from Chromium's fake capture device. Skips where selenium, chromium or chromedriver is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers_serve import running_server

pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
PARK = SAMPLES / "park.flac"
WAIT = 60  # seconds: the first request also loads the model's first batch


@pytest.fixture(scope="module", autouse=True)
def chromium() -> tuple[str, str]:
    """Chromium's and chromedriver's paths; skips the module's tests (before any server starts) without them."""
    browser, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("chromium or chromedriver is not installed")
    return browser, driver


def _chromium(paths: tuple[str, str], *flags: str):
    """A headless Chromium under chromedriver; skips the test where it will not start."""
    browser, driver = paths
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", *flags):
        options.add_argument(flag)
    try:
        return webdriver.Chrome(options=options, service=webdriver.ChromeService(driver))
    except Exception as error:  # a broken install: say so in one line
        pytest.skip(f"chromium would not start: {str(error).splitlines()[0]}")


def _serve(bundle, name: str) -> Iterator[str]:
    from asr.serve import ServerSettings, create_app

    with running_server(create_app(bundle, None, ServerSettings(model_name=name))) as url:
        yield url


@pytest.fixture(scope="module")
def scripted_server(scripted_folder: Path) -> Iterator[str]:
    from asr.models.registry import load_model

    yield from _serve(load_model(str(scripted_folder)), "scripted")


@pytest.fixture
def browser(chromium: tuple[str, str]) -> Iterator:
    driver = _chromium(chromium)
    yield driver
    driver.quit()


def _upload(driver, url: str, path: Path) -> None:
    """Opens the page, chooses `path` and transcribes it; returns once the stream is done (or failed)."""
    driver.get(url + "/")
    driver.find_element(By.ID, "file").send_keys(str(path))
    driver.find_element(By.ID, "transcribe").click()
    WebDriverWait(driver, WAIT).until(
        lambda d: d.find_element(By.ID, "status").get_attribute("data-kind") in ("done", "error"))


def test_page_uploads_and_shows_segments_as_they_stream(browser, scripted_server: str) -> None:
    _upload(browser, scripted_server, PARK)
    status = browser.find_element(By.ID, "status").text
    assert status.startswith("Done"), status
    assert "audio seconds" in status
    assert "hello world" in browser.find_element(By.ID, "transcript").text
    segments = browser.find_elements(By.CSS_SELECTOR, "#segments .segment")
    assert segments and "hello world" in segments[0].text and segments[0].text.startswith("00:00.000")
    for fmt in ("txt", "srt", "vtt", "json"):
        assert browser.find_element(By.ID, f"download-{fmt}").is_enabled()
    assert browser.find_element(By.ID, "player").get_attribute("src").startswith("blob:")
    # The srt is built in the page from the streamed segments.
    srt = browser.execute_script("return FORMATS.srt()[1]")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:01,000\nhello world\n\n"), srt


def test_page_shows_the_servers_error(browser, scripted_server: str, tmp_path: Path) -> None:
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all" * 64)
    _upload(browser, scripted_server, junk)
    status = browser.find_element(By.ID, "status").text
    assert status.startswith("Error: Invalid file"), status


def test_page_records_live_from_the_microphone(chromium: tuple[str, str], scripted_server: str,
                                               tmp_path: Path) -> None:
    import soundfile

    audio, rate = soundfile.read(PARK, dtype="int16")
    assert rate == 16000
    wav = tmp_path / "park.wav"
    soundfile.write(wav, audio, rate, subtype="PCM_16")
    driver = _chromium(chromium, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                       f"--use-file-for-fake-audio-capture={wav}")
    try:
        driver.get(scripted_server + "/")
        driver.find_element(By.ID, "record").click()
        status = driver.find_element(By.ID, "live-status")
        WebDriverWait(driver, WAIT).until(lambda d: status.get_attribute("data-kind") != "busy"
                                          or "Listening" in status.text)
        assert "Listening" in status.text, status.text
        # The fake device plays the file in a loop; words come once the server's VAD has heard speech.
        WebDriverWait(driver, WAIT).until(lambda d: "hello world" in d.find_element(By.ID, "live").text
                                          + d.find_element(By.ID, "live-pending").text)
        driver.find_element(By.ID, "record").click()
        WebDriverWait(driver, WAIT).until(lambda d: status.get_attribute("data-kind") in ("done", "error"))
        assert status.text.startswith("Done"), status.text
        assert "hello world" in driver.find_element(By.ID, "live").text
        assert driver.find_element(By.ID, "record").text == "Record"
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def base_server(base) -> Iterator[str]:
    yield from _serve(base, "base")


def test_page_transcribes_with_the_base_model(browser, base_server: str) -> None:
    _upload(browser, base_server, PARK)
    assert browser.find_element(By.ID, "status").text.startswith("Done")
    assert "children were playing in the park" in browser.find_element(By.ID, "transcript").text.lower()
